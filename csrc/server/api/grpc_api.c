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
#include "server/observe/statistics.h"
#include "transport/grpc.h"

#define SERVICE "/inference.GRPCInferenceService/"
#define HEALTH_SERVICE "/grpc.health.v1.Health/"

enum {
    RPC_UNKNOWN = 0,
    RPC_SERVER_LIVE,
    RPC_SERVER_READY,
    RPC_MODEL_READY,
    RPC_SERVER_METADATA,
    RPC_MODEL_METADATA,
    RPC_MODEL_CONFIG,
    RPC_MODEL_INFER,
    RPC_MODEL_STREAM_INFER,
    RPC_SYS_SHM_STATUS,
    RPC_SYS_SHM_REGISTER,
    RPC_SYS_SHM_UNREGISTER,
    RPC_CUDA_SHM_STATUS,
    RPC_CUDA_SHM_REGISTER,
    RPC_CUDA_SHM_UNREGISTER,
    RPC_REPO_INDEX,
    RPC_REPO_LOAD,
    RPC_REPO_UNLOAD,
    RPC_HEALTH_CHECK,
    RPC_HEALTH_WATCH,
    RPC_MODEL_STATISTICS,
    RPC_LOG_SETTINGS,
    RPC_TRACE_SETTING,
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
    {"ModelConfig", RPC_MODEL_CONFIG},
    {"ModelInfer", RPC_MODEL_INFER},
    {"ModelStreamInfer", RPC_MODEL_STREAM_INFER},
    {"SystemSharedMemoryStatus", RPC_SYS_SHM_STATUS},
    {"SystemSharedMemoryRegister", RPC_SYS_SHM_REGISTER},
    {"SystemSharedMemoryUnregister", RPC_SYS_SHM_UNREGISTER},
    {"CudaSharedMemoryStatus", RPC_CUDA_SHM_STATUS},
    {"CudaSharedMemoryRegister", RPC_CUDA_SHM_REGISTER},
    {"CudaSharedMemoryUnregister", RPC_CUDA_SHM_UNREGISTER},
    {"RepositoryIndex", RPC_REPO_INDEX},
    {"RepositoryModelLoad", RPC_REPO_LOAD},
    {"RepositoryModelUnload", RPC_REPO_UNLOAD},
    {"ModelStatistics", RPC_MODEL_STATISTICS},
    {"LogSettings", RPC_LOG_SETTINGS},
    {"TraceSetting", RPC_TRACE_SETTING},
};

/* ---- the access log ----------------------------------------------------------------------- */

static void copy_cut(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strnlen(src, cap - 1) : 0;
    memcpy(dst, src ? src : "", n);
    dst[n] = '\0';
}

/* Names the model an RPC asked for in its access log line (a stream's last request's). */
static void note_model(const oi_server_t *s, oi_grpc_call_t *call, const char *name, const char *version)
{
    if (s->access_log == NULL)
        return;
    copy_cut(call->log_model, sizeof(call->log_model), name);
    copy_cut(call->log_version, sizeof(call->log_version), version);
}

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

/* ModelConfigResponse { config = 1 }: the version's serialized ModelConfig, sent as it is
 * behind the field's tag and length. */
static void model_config(oi_grpc_call_t *call, oi_model_t *m)
{
    if (m->error != NULL || m->config_pb == NULL) {
        finish_status(call, m->error ? oi_status_new(OI_UNAVAILABLE, "model '%s' version %s is not ready: %s", m->name,
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
    note_model(s, call, req->name, req->version);
    oi_model_t *m = req->name[0] ? oi_registry_find(&s->registry, req->name, req->version, &err) : NULL;
    if (m == NULL && call->kind == RPC_MODEL_READY && (err == NULL || err->code == OI_NOT_FOUND)) {
        /* As Triton: a model or version that is not served is simply not ready. */
        oi_status_free(err);
        Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
        reply(call, &r.base);
    } else if (m == NULL) {
        if (err == NULL)
            err = oi_status_new(OI_BAD_REQUEST, "the request has no model name");
        finish_status(call, err);
    } else if (call->kind == RPC_MODEL_READY) {
        Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
        r.ready = m->error == NULL && m->sched != NULL;
        reply(call, &r.base);
    } else if (call->kind == RPC_MODEL_METADATA) {
        model_metadata(call, m);
    } else {
        model_config(call, m);
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

/* ---- statistics ----------------------------------------------------------------------------- */

/* One model version's ModelStatistics, pointing into `mem` (zeroed storage the caller frees)
 * and into the snapshot. */
typedef struct stats_msg_s {
    Inference__ModelStatistics ms;
    Inference__InferStatistics is;
    Inference__StatisticDuration d[8];
} stats_msg_t;

static void set_duration(Inference__StatisticDuration *d, const oi_stat_duration_t *v)
{
    inference__statistic_duration__init(d);
    d->count = v->count;
    d->ns = v->ns;
}

static int model_statistics_msg(stats_msg_t *m, const oi_model_stats_t *it)
{
    const oi_stats_snapshot_t *s = &it->snap;
    inference__model_statistics__init(&m->ms);
    inference__infer_statistics__init(&m->is);
    const oi_stat_duration_t *v[8] = {&s->success,       &s->fail,           &s->queue, &s->compute_input,
                                      &s->compute_infer, &s->compute_output, &it->cache_hit, &it->cache_miss};
    for (int i = 0; i < 8; i++)
        set_duration(&m->d[i], v[i]);
    m->is.success = &m->d[0];
    m->is.fail = &m->d[1];
    m->is.queue = &m->d[2];
    m->is.compute_input = &m->d[3];
    m->is.compute_infer = &m->d[4];
    m->is.compute_output = &m->d[5];
    m->is.cache_hit = &m->d[6];
    m->is.cache_miss = &m->d[7];
    m->ms.name = it->model->name;
    m->ms.version = (char *)it->model->version_str;
    m->ms.last_inference = s->last_inference_ms;
    m->ms.inference_count = s->inference_count;
    m->ms.execution_count = s->execution_count;
    m->ms.inference_stats = &m->is;
    if (s->n_batches == 0)
        return 0;
    /* One allocation: the pointer array, then the messages, then their durations. */
    size_t nb = s->n_batches;
    char *mem = calloc(
        1, nb * (sizeof(void *) + sizeof(Inference__InferBatchStatistics) + 3 * sizeof(Inference__StatisticDuration)));
    if (mem == NULL)
        return -1;
    Inference__InferBatchStatistics **ptrs = (void *)mem;
    Inference__InferBatchStatistics *bm = (void *)(mem + nb * sizeof(void *));
    Inference__StatisticDuration *bd = (void *)(bm + nb);
    for (size_t b = 0; b < nb; b++) {
        inference__infer_batch_statistics__init(&bm[b]);
        bm[b].batch_size = s->batches[b].batch_size;
        set_duration(&bd[3 * b], &s->batches[b].compute_input);
        set_duration(&bd[3 * b + 1], &s->batches[b].compute_infer);
        set_duration(&bd[3 * b + 2], &s->batches[b].compute_output);
        bm[b].compute_input = &bd[3 * b];
        bm[b].compute_infer = &bd[3 * b + 1];
        bm[b].compute_output = &bd[3 * b + 2];
        ptrs[b] = &bm[b];
    }
    m->ms.n_batch_stats = nb;
    m->ms.batch_stats = ptrs; /* freed by the caller through this pointer */
    return 0;
}

static void model_statistics(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    Inference__ModelStatisticsRequest *req =
        inference__model_statistics_request__unpack(NULL, msg->len, (const uint8_t *)msg->data);
    if (req == NULL) {
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "malformed ModelStatisticsRequest");
        return;
    }
    oi_model_stats_t *items = NULL;
    size_t n = 0;
    oi_status_t *st = oi__statistics_off(s);
    if (st == NULL)
        st = oi_statistics_collect(&s->registry, req->name, req->version, &items, &n);
    inference__model_statistics_request__free_unpacked(req, NULL);
    if (st != NULL) {
        finish_status(call, st);
        return;
    }
    stats_msg_t *msgs = calloc(n ? n : 1, sizeof(*msgs));
    Inference__ModelStatistics **ptrs = calloc(n ? n : 1, sizeof(*ptrs));
    int rc = msgs && ptrs ? 0 : -1;
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = model_statistics_msg(&msgs[i], &items[i]);
        ptrs[i] = &msgs[i].ms;
    }
    if (rc != 0) {
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
    } else {
        Inference__ModelStatisticsResponse r = INFERENCE__MODEL_STATISTICS_RESPONSE__INIT;
        r.n_model_stats = n;
        r.model_stats = ptrs;
        reply(call, &r.base);
    }
    for (size_t i = 0; msgs && i < n; i++)
        free(msgs[i].ms.batch_stats);
    free(msgs);
    free(ptrs);
    oi_statistics_release(items, n);
}

/* ---- model repository ------------------------------------------------------------------- */

static void repo_index_reply(oi_grpc_call_t *call, const oi_repo_call_t *rc)
{
    Inference__RepositoryIndexResponse r = INFERENCE__REPOSITORY_INDEX_RESPONSE__INIT;
    Inference__RepositoryIndexResponse__ModelIndex *items = calloc(rc->n_entries + 1, sizeof(*items));
    Inference__RepositoryIndexResponse__ModelIndex **ptrs = calloc(rc->n_entries + 1, sizeof(*ptrs));
    if (items == NULL || ptrs == NULL) {
        oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
    } else {
        for (size_t i = 0; i < rc->n_entries; i++) {
            const oi_repo_entry_t *e = &rc->entries[i];
            inference__repository_index_response__model_index__init(&items[i]);
            items[i].name = e->name;
            if (e->version)
                items[i].version = e->version;
            if (e->state)
                items[i].state = e->state;
            if (e->reason)
                items[i].reason = e->reason;
            ptrs[i] = &items[i];
        }
        r.n_models = rc->n_entries;
        r.models = ptrs;
        reply(call, &r.base);
    }
    free(items);
    free(ptrs);
}

/* Ends what submit_control began, once the call's answer is written. */
static void end_control(oi_server_t *s, oi_grpc_call_t *call, oi_repo_call_t *rc)
{
    oi_repo_call_free(rc);
    oi_grpc_call_unref(call);
    atomic_fetch_sub(&s->grpc_inflight, 1);
}

/* Runs a control call (repository, logging, trace) for gRPC `call` on a control thread; `done` comes
 * back on the call's loop. The call counts as in flight until then. NULL, or why not. */
static oi_status_t *submit_control(oi_server_t *s, oi_grpc_call_t *call, oi_repo_call_t *rc, oi_repo_done_cb done)
{
    rc->grpc = 1;
    oi_grpc_call_ref(call);
    atomic_fetch_add(&s->grpc_inflight, 1);
    oi_status_t *st = oi__repo_submit(s, rc, call->loop, done, call);
    if (st != NULL) {
        atomic_fetch_sub(&s->grpc_inflight, 1);
        oi_grpc_call_unref(call);
    }
    return st;
}

/* On the call's loop thread, with the handler's outcome. */
static void finish_repo(oi_repo_call_t *rc)
{
    oi_grpc_call_t *call = rc->ctx;
    oi_server_t *s = call->data;
    call->work = NULL; /* on_gone no longer reaches rc */
    if (oi_grpc_call_open(call)) {
        if (rc->status != NULL) {
            oi_status_t *st = rc->status;
            rc->status = NULL;
            finish_status(call, st);
        } else if (rc->op == OI_REPO_INDEX) {
            repo_index_reply(call, rc);
        } else if (rc->op == OI_REPO_LOAD) {
            Inference__RepositoryModelLoadResponse r = INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
            reply(call, &r.base);
        } else {
            Inference__RepositoryModelUnloadResponse r = INFERENCE__REPOSITORY_MODEL_UNLOAD_RESPONSE__INIT;
            reply(call, &r.base);
        }
    }
    end_control(s, call, rc);
}

/* Copies a load or unload request's parameters into the call, values as the client typed them
 * (the repository handler judges them). */
static int repo_params(oi_repo_call_t *rc, Inference__RepositoryModelLoadRequest__ParametersEntry **entries, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const Inference__ModelRepositoryParameter *v = entries[i]->value;
        int rc_ = 0;
        switch (v ? v->parameter_choice_case : INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE__NOT_SET) {
        case INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_BOOL_PARAM:
            rc_ = oi_repo_call_add_param(rc, entries[i]->key, OI_REPO_PARAM_BOOL, v->bool_param != 0, NULL, 0);
            break;
        case INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_INT64_PARAM:
            rc_ = oi_repo_call_add_param(rc, entries[i]->key, OI_REPO_PARAM_INT, v->int64_param, NULL, 0);
            break;
        case INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_STRING_PARAM:
            rc_ = oi_repo_call_add_param(rc, entries[i]->key, OI_REPO_PARAM_STRING, 0, v->string_param,
                                         strlen(v->string_param));
            break;
        case INFERENCE__MODEL_REPOSITORY_PARAMETER__PARAMETER_CHOICE_BYTES_PARAM:
            rc_ = oi_repo_call_add_param(rc, entries[i]->key, OI_REPO_PARAM_BYTES, 0, v->bytes_param.data,
                                         v->bytes_param.len);
            break;
        default: /* no value set: an empty string is what proto3 would read */
            rc_ = oi_repo_call_add_param(rc, entries[i]->key, OI_REPO_PARAM_STRING, 0, "", 0);
            break;
        }
        if (rc_ != 0)
            return -1;
    }
    return 0;
}

/* RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload: decoded here, run by the
 * repository handler on a control thread, answered in finish_repo. */
static void repo_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    const uint8_t *data = (const uint8_t *)msg->data;
    oi_repo_call_t *rc = NULL;
    const char *repository = NULL;
    oi_status_t *st = NULL;
    Inference__RepositoryIndexRequest *iq = NULL;
    Inference__RepositoryModelLoadRequest *lq = NULL;
    if (call->kind == RPC_REPO_INDEX) {
        if ((iq = inference__repository_index_request__unpack(NULL, msg->len, data)) == NULL) {
            oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "malformed RepositoryIndexRequest");
            return;
        }
        repository = iq->repository_name;
        if ((rc = oi_repo_call_new(OI_REPO_INDEX)) != NULL)
            rc->ready = iq->ready != 0;
    } else {
        /* RepositoryModelUnloadRequest has the same fields and numbers as the load request. */
        if ((lq = inference__repository_model_load_request__unpack(NULL, msg->len, data)) == NULL) {
            oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT,
                           call->kind == RPC_REPO_LOAD ? "malformed RepositoryModelLoadRequest"
                                                       : "malformed RepositoryModelUnloadRequest");
            return;
        }
        repository = lq->repository_name;
        rc = oi_repo_call_new(call->kind == RPC_REPO_LOAD ? OI_REPO_LOAD : OI_REPO_UNLOAD);
        if (rc != NULL &&
            ((rc->model = strdup(lq->model_name)) == NULL || repo_params(rc, lq->parameters, lq->n_parameters) != 0)) {
            oi_repo_call_free(rc);
            rc = NULL;
        }
    }
    if (rc == NULL)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    else if (repository[0] != '\0')
        st = oi_status_new(OI_UNIMPLEMENTED, "'repository_name' specification is not supported");
    if (iq)
        inference__repository_index_request__free_unpacked(iq, NULL);
    if (lq)
        inference__repository_model_load_request__free_unpacked(lq, NULL);
    if (st == NULL && (st = submit_control(s, call, rc, finish_repo)) == NULL)
        call->work = rc; /* for on_gone, until finish_repo (on this loop: not before we return) */
    if (st != NULL) {
        oi_repo_call_free(rc);
        finish_status(call, st);
    }
}

/* ---- logging ------------------------------------------------------------------------------ */

/* On the call's loop thread: every setting as LogSettingsResponse. */
static void finish_logging(oi_repo_call_t *rc)
{
    oi_grpc_call_t *call = rc->ctx;
    oi_server_t *s = call->data;
    if (oi_grpc_call_open(call)) {
        size_t n = rc->n_results;
        Inference__LogSettingsResponse__SettingValue *vals = calloc(n + 1, sizeof(*vals));
        Inference__LogSettingsResponse__SettingsEntry *ents = calloc(n + 1, sizeof(*ents));
        Inference__LogSettingsResponse__SettingsEntry **ptrs = calloc(n + 1, sizeof(*ptrs));
        if (rc->status != NULL) {
            oi_status_t *st = rc->status;
            rc->status = NULL;
            finish_status(call, st);
        } else if (vals == NULL || ents == NULL || ptrs == NULL) {
            oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        } else {
            for (size_t i = 0; i < n; i++) {
                const oi_repo_param_t *p = &rc->results[i];
                inference__log_settings_response__setting_value__init(&vals[i]);
                if (p->kind == OI_REPO_PARAM_BOOL) {
                    vals[i].parameter_choice_case =
                        INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_BOOL_PARAM;
                    vals[i].bool_param = p->number != 0;
                } else if (p->kind == OI_REPO_PARAM_INT) {
                    vals[i].parameter_choice_case =
                        INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_UINT32_PARAM;
                    vals[i].uint32_param = (uint32_t)p->number;
                } else {
                    vals[i].parameter_choice_case =
                        INFERENCE__LOG_SETTINGS_RESPONSE__SETTING_VALUE__PARAMETER_CHOICE_STRING_PARAM;
                    vals[i].string_param = p->data;
                }
                inference__log_settings_response__settings_entry__init(&ents[i]);
                ents[i].key = p->name;
                ents[i].value = &vals[i];
                ptrs[i] = &ents[i];
            }
            Inference__LogSettingsResponse r = INFERENCE__LOG_SETTINGS_RESPONSE__INIT;
            r.n_settings = n;
            r.settings = ptrs;
            reply(call, &r.base);
        }
        free(vals);
        free(ents);
        free(ptrs);
    }
    end_control(s, call, rc);
}

/* LogSettings: the settings to change go to the application's handler as typed parameters (a
 * value left unset as an empty string, which fails the handler's type check). */
static void log_settings_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    Inference__LogSettingsRequest *q =
        inference__log_settings_request__unpack(NULL, msg->len, (const uint8_t *)msg->data);
    if (q == NULL) {
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "malformed LogSettingsRequest");
        return;
    }
    oi_repo_call_t *rc = oi_repo_call_new(OI_REPO_LOGGING);
    int bad = rc == NULL;
    for (size_t i = 0; !bad && i < q->n_settings; i++) {
        const Inference__LogSettingsRequest__SettingValue *v = q->settings[i]->value;
        const char *key = q->settings[i]->key;
        switch (v ? v->parameter_choice_case
                  : INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE__NOT_SET) {
        case INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_BOOL_PARAM:
            bad = oi_repo_call_add_param(rc, key, OI_REPO_PARAM_BOOL, v->bool_param != 0, NULL, 0);
            break;
        case INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_UINT32_PARAM:
            bad = oi_repo_call_add_param(rc, key, OI_REPO_PARAM_INT, v->uint32_param, NULL, 0);
            break;
        case INFERENCE__LOG_SETTINGS_REQUEST__SETTING_VALUE__PARAMETER_CHOICE_STRING_PARAM:
            bad = oi_repo_call_add_param(rc, key, OI_REPO_PARAM_STRING, 0, v->string_param, strlen(v->string_param));
            break;
        default: bad = oi_repo_call_add_param(rc, key, OI_REPO_PARAM_STRING, 0, "", 0); break;
        }
    }
    inference__log_settings_request__free_unpacked(q, NULL);
    oi_status_t *st = bad ? oi_status_new(OI_INTERNAL, "out of memory") : NULL;
    if (st == NULL)
        st = submit_control(s, call, rc, finish_logging);
    if (st != NULL) {
        oi_repo_call_free(rc);
        finish_status(call, st);
    }
}

/* ---- trace ------------------------------------------------------------------------------- */

/* On the call's loop thread: every setting as TraceSettingResponse, each value a list of
 * strings (a STRING result is a list of one). */
static void finish_trace(oi_repo_call_t *rc)
{
    oi_grpc_call_t *call = rc->ctx;
    oi_server_t *s = call->data;
    if (oi_grpc_call_open(call)) {
        size_t n = rc->n_results, n_strings = 0;
        for (size_t i = 0; i < n; i++) {
            const oi_repo_param_t *p = &rc->results[i];
            for (size_t at = 0; p->kind == OI_REPO_PARAM_LIST && at < p->len; at += strlen(p->data + at) + 1)
                n_strings++;
            n_strings += p->kind != OI_REPO_PARAM_LIST;
        }
        Inference__TraceSettingResponse__SettingValue *vals = calloc(n + 1, sizeof(*vals));
        Inference__TraceSettingResponse__SettingsEntry *ents = calloc(n + 1, sizeof(*ents));
        Inference__TraceSettingResponse__SettingsEntry **ptrs = calloc(n + 1, sizeof(*ptrs));
        char **strings = calloc(n_strings + 1, sizeof(*strings));
        if (rc->status != NULL) {
            oi_status_t *st = rc->status;
            rc->status = NULL;
            finish_status(call, st);
        } else if (vals == NULL || ents == NULL || ptrs == NULL || strings == NULL) {
            oi_grpc_finish(call, OI_GRPC_INTERNAL, "out of memory");
        } else {
            char **next = strings;
            for (size_t i = 0; i < n; i++) {
                oi_repo_param_t *p = &rc->results[i];
                inference__trace_setting_response__setting_value__init(&vals[i]);
                vals[i].value = next;
                if (p->kind == OI_REPO_PARAM_LIST) {
                    for (size_t at = 0; at < p->len; at += strlen(p->data + at) + 1)
                        *next++ = p->data + at;
                } else {
                    *next++ = p->data; /* a STRING (the handler answers every trace setting as text) */
                }
                vals[i].n_value = (size_t)(next - vals[i].value);
                inference__trace_setting_response__settings_entry__init(&ents[i]);
                ents[i].key = p->name;
                ents[i].value = &vals[i];
                ptrs[i] = &ents[i];
            }
            Inference__TraceSettingResponse r = INFERENCE__TRACE_SETTING_RESPONSE__INIT;
            r.n_settings = n;
            r.settings = ptrs;
            reply(call, &r.base);
        }
        free(vals);
        free(ents);
        free(ptrs);
        free(strings);
    }
    end_control(s, call, rc);
}

/* TraceSetting: each setting goes to the application's handler as a LIST parameter (its
 * values; none clears a model's own setting), with the model, which must be ready. */
static void trace_setting_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
{
    Inference__TraceSettingRequest *q =
        inference__trace_setting_request__unpack(NULL, msg->len, (const uint8_t *)msg->data);
    if (q == NULL) {
        oi_grpc_finish(call, OI_GRPC_INVALID_ARGUMENT, "malformed TraceSettingRequest");
        return;
    }
    oi_status_t *st = NULL;
    if (q->model_name[0] != '\0') {
        oi_model_t *m = oi_registry_find(&s->registry, q->model_name, NULL, &st);
        if (m != NULL && m->error != NULL)
            st = oi_status_new(OI_BAD_REQUEST, "Request for unknown model : %s", q->model_name);
        else if (m == NULL) {
            oi_status_free(st);
            st = oi_status_new(OI_BAD_REQUEST, "Request for unknown model : %s", q->model_name);
        }
        oi_model_unref(m);
    }
    oi_repo_call_t *rc = st == NULL ? oi_repo_call_new(OI_REPO_TRACE) : NULL;
    int bad = st == NULL && rc == NULL;
    if (!bad && rc != NULL && q->model_name[0] != '\0')
        bad = (rc->model = strdup(q->model_name)) == NULL;
    for (size_t i = 0; !bad && rc != NULL && i < q->n_settings; i++) {
        const Inference__TraceSettingRequest__SettingValue *v = q->settings[i]->value;
        oi_sbuf_t list = {0};
        for (size_t k = 0; !bad && v != NULL && k < v->n_value; k++)
            bad = oi_sbuf_append(&list, v->value[k], strlen(v->value[k]) + 1);
        if (!bad)
            bad = oi_repo_call_add_param(rc, q->settings[i]->key, OI_REPO_PARAM_LIST, 0, list.data, list.len);
        oi_sbuf_free(&list);
    }
    inference__trace_setting_request__free_unpacked(q, NULL);
    if (bad)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    if (st == NULL)
        st = submit_control(s, call, rc, finish_trace);
    if (st != NULL) {
        oi_repo_call_free(rc);
        finish_status(call, st);
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

/* Encodes `resp` (one of `inf`'s responses) as `mode` asks (OI_PB_*) and queues it; with
 * `part`, the part's credit rides on the message's last slice. A failure to encode answers
 * the error instead. */
static void send_response(oi_grpc_call_t *call, oi_infer_t *inf, const oi_response_t *resp, int mode,
                          oi_infer_part_t *part)
{
    oi_pb_iov_t small[9];
    size_t cap = OI_PB_RESPONSE_PARTS(resp->n_outputs), n = 0, total = 0;
    oi_pb_iov_t *parts = cap <= 9 ? small : malloc(cap * sizeof(*parts));
    oi_status_t *st = parts == NULL ? oi_status_new(OI_INTERNAL, "out of memory") : NULL;
    if (st == NULL)
        st = oi_pb_encode_infer_response(inf->model->name, inf->model->version_str, &inf->req, resp, mode, parts, &n,
                                         &total);
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
            size_t last = n;
            while (last > 0 && iov[last - 1].len == 0)
                last--;
            if (part != NULL && last > 0)
                oi_infer_part_hold(part, &iov[last - 1]);
            oi_grpc_send(call, iov, n, total);
            if (iov != iov_small)
                free(iov);
        }
    }
    if (parts != small)
        free(parts);
}

/* One response of a decoupled model, as it comes: more will follow. */
static void stream_part(oi_infer_t *inf, oi_infer_part_t *part)
{
    oi_grpc_call_t *call = inf->ctx;
    if (oi_grpc_call_open(call))
        send_response(call, inf, &part->resp, OI_PB_STREAM_MORE, part);
}

/* On the call's loop thread once the backend has run: encode and send. */
static void finish_infer(oi_infer_t *inf)
{
    oi_grpc_call_t *call = inf->ctx;
    oi_server_t *s = call->data;
    call->pending--;
    if (inf->prev)
        inf->prev->next = inf->next;
    else
        call->work = inf->next;
    if (inf->next)
        inf->next->prev = inf->prev;
    if (inf->cancelled)
        atomic_fetch_sub(&s->grpc_orphans, 1);
    uint64_t send_start = inf->trace != NULL ? oi_now_ns() : 0;
    if (oi_grpc_call_open(call)) {
        oi_status_t *st = inf->job.status;
        inf->job.status = NULL;
        if (st != NULL) {
            infer_failed(call, st, inf->model, &inf->req);
        } else if (inf->ds == NULL || inf->req.empty_final) {
            /* A decoupled model's responses went as they came: its end is an empty response
             * flagged final, only when the client asked for one (as Triton). */
            int mode = call->kind == RPC_MODEL_INFER ? OI_PB_UNARY : OI_PB_STREAM_FINAL;
            send_response(call, inf, &inf->job.resp, mode, NULL);
            if (call->kind == RPC_MODEL_INFER && oi_grpc_call_open(call))
                oi_grpc_finish(call, OI_GRPC_OK, NULL);
        }
        maybe_end_stream(call);
        oi_infer_trace_end(inf, send_start);
    }
    oi_infer_free(inf);
    oi_grpc_call_unref(call);
    atomic_fetch_sub(&s->grpc_inflight, 1);
}

static const oi_peer_t *call_peer(void *call) { return oi_grpc_call_peer(call); }

static void handle_infer(oi_server_t *s, oi_grpc_call_t *call, oi_buf_t *msg)
{
    uint64_t read_end = s->tracer != NULL ? oi_now_ns() : 0;
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
    note_model(s, call, name.ptr, version.ptr);
    oi_model_t *m = oi_registry_find(&s->registry, name.ptr, version.ptr, &st);
    if (st == NULL && m->decoupled && call->kind == RPC_MODEL_INFER) /* Triton's status and words */
        st = oi_status_new(OI_UNIMPLEMENTED, "ModelInfer RPC doesn't support models with decoupled transaction policy");
    if (st != NULL) {
        infer_failed(call, st, NULL, &inf->req);
        oi_model_unref(m);
        oi_infer_free(inf);
        return;
    }
    if (m->decoupled)
        inf->part = stream_part;
    /* A stream's sequences are its own until another call sends their next request: they are
     * released when it is cancelled (on_gone). */
    if (call->kind == RPC_MODEL_STREAM_INFER && m->seq != NULL) {
        if (call->session == 0)
            call->session = atomic_fetch_add(&s->grpc_sessions, 1) + 1;
        inf->req.seq.session = call->session;
    }
    oi_grpc_call_ref(call);
    call->pending++;
    atomic_fetch_add(&s->grpc_inflight, 1);
    inf->shm = &s->shm;
    inf->shm_caller = (oi_shm_caller_t){call_peer, call};
    inf->count_stats = s->cfg.statistics;
    /* A stream's message was read when it came (the call began long before); out of memory,
     * the request goes untraced. */
    uint64_t read_start = call->kind == RPC_MODEL_INFER ? call->start_ns : read_end;
    if (s->tracer != NULL)
        (void)oi_infer_trace_begin(inf, s->tracer, m, 1, read_start, read_end);
    st = oi_infer_submit(inf, m, call->loop, finish_infer, call); /* takes the model reference */
    if (st != NULL) {
        call->pending--;
        atomic_fetch_sub(&s->grpc_inflight, 1);
        infer_failed(call, st, m, &inf->req);
        oi_infer_free(inf);
        oi_grpc_call_unref(call);
        return;
    }
    inf->next = call->work; /* for on_gone */
    if (inf->next)
        inf->next->prev = inf;
    call->work = inf;
}

/* ---- the handler ------------------------------------------------------------------------ */

static void on_call(void *ctx, oi_grpc_call_t *call)
{
    oi_server_t *s = ctx;
    call->data = s;
    const char *m = call->method;
    const char *rpc;
    if (oi__legacy_grpc_call(s, call)) /* nvidia.inferenceserver.GRPCService, the legacy v1 API */
        return;
    if (strncmp(m, HEALTH_SERVICE, sizeof(HEALTH_SERVICE) - 1) == 0) {
        rpc = m + sizeof(HEALTH_SERVICE) - 1;
        call->kind = strcmp(rpc, "Check") == 0   ? RPC_HEALTH_CHECK
                     : strcmp(rpc, "Watch") == 0 ? RPC_HEALTH_WATCH
                                                 : RPC_UNKNOWN;
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
            if (strcmp(rpc, rpcs[i].name) == 0)
                call->kind = rpcs[i].kind;
    }
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
        reply(call, &r.base);
        break;
    }
    case RPC_SERVER_READY: {
        Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
        r.ready = oi__server_ready(s) != 0;
        reply(call, &r.base);
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
        oi__health_rpc(s, call, msg, call->kind == RPC_HEALTH_WATCH);
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
    case RPC_REPO_INDEX:
    case RPC_REPO_LOAD:
    case RPC_REPO_UNLOAD: repo_rpc(s, call, msg); break;
    case RPC_LOG_SETTINGS: log_settings_rpc(s, call, msg); break;
    case RPC_TRACE_SETTING: trace_setting_rpc(s, call, msg); break;
    case RPC_MODEL_STATISTICS:
        model_statistics(s, call, msg);
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
        maybe_end_stream(call);
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
