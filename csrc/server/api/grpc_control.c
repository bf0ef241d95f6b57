/* The V2 gRPC service's extensions, for grpc_api.c's dispatch: shared memory, statistics, the
 * model repository, logging and trace settings. Their requests are small: protobuf-c unpacks
 * them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc_service.pb-c.h"

#include "server/server_impl.h"
#include "server/observe/statistics.h"
#include "server/api/grpc_api_impl.h"

/* ---- shared memory ------------------------------------------------------------------------ */

static void shm_status(oi_server_t *s, oi_grpc_call_t *call, oi_shm_kind_t kind, const char *name)
{
    oi_shm_region_t **regions;
    size_t n;
    oi_status_t *st = oi_shm_list(&s->shm, oi_grpc_call_peer(call), kind, name, &regions, &n);
    if (st != NULL) {
        oi__grpc_finish_status(call, st);
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
        oi__grpc_reply(call, &r.base);
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
        oi__grpc_reply(call, &r.base);
    }
    free(ptrs);
    free(mem);
    oi_shm_release_all(regions, n);
}

/* Answers a register or unregister call: its empty response, or the status. */
static void shm_done(oi_grpc_call_t *call, oi_status_t *st, const ProtobufCMessage *empty)
{
    if (st != NULL)
        oi__grpc_finish_status(call, st);
    else
        oi__grpc_reply(call, empty);
}

/* The six shared-memory RPCs. Their requests are small: protobuf-c unpacks them. */
void oi__grpc_shm_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
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

void oi__grpc_model_statistics(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
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
        oi__grpc_finish_status(call, st);
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
        oi__grpc_reply(call, &r.base);
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
        oi__grpc_reply(call, &r.base);
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
            oi__grpc_finish_status(call, st);
        } else if (rc->op == OI_REPO_INDEX) {
            repo_index_reply(call, rc);
        } else if (rc->op == OI_REPO_LOAD) {
            Inference__RepositoryModelLoadResponse r = INFERENCE__REPOSITORY_MODEL_LOAD_RESPONSE__INIT;
            oi__grpc_reply(call, &r.base);
        } else {
            Inference__RepositoryModelUnloadResponse r = INFERENCE__REPOSITORY_MODEL_UNLOAD_RESPONSE__INIT;
            oi__grpc_reply(call, &r.base);
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
void oi__grpc_repo_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
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
        oi__grpc_finish_status(call, st);
    }
}

/* ---- model readiness ---------------------------------------------------------------------- */

/* On the call's loop thread: the application's answer (a failed handler: not ready). */
static void finish_ready(oi_repo_call_t *rc)
{
    oi_grpc_call_t *call = rc->ctx;
    oi_server_t *s = call->data;
    if (oi_grpc_call_open(call)) {
        int ready = rc->status == NULL && rc->ready;
        if (call->kind == RPC_HEALTH_CHECK || call->kind == RPC_HEALTH_WATCH) {
            oi__health_answer(s, call, ready);
        } else if (call->kind == RPC_SERVER_READY) {
            Inference__ServerReadyResponse r = INFERENCE__SERVER_READY_RESPONSE__INIT;
            r.ready = ready;
            oi__grpc_reply(call, &r.base);
        } else {
            Inference__ModelReadyResponse r = INFERENCE__MODEL_READY_RESPONSE__INIT;
            r.ready = ready;
            oi__grpc_reply(call, &r.base);
        }
    }
    end_control(s, call, rc);
}

int oi__grpc_probe_ready(oi_server_t *s, oi_grpc_call_t *call, const oi_model_t *m)
{
    oi_repo_call_t *rc = oi_repo_call_new(OI_REPO_READY);
    if (rc == NULL || (m != NULL && (rc->model = strdup(m->name)) == NULL)) {
        oi_repo_call_free(rc);
        return -1;
    }
    rc->version = m != NULL ? m->version : -1;
    oi_status_t *st = submit_control(s, call, rc, finish_ready);
    if (st != NULL) {
        oi_status_free(st);
        oi_repo_call_free(rc);
        return -1;
    }
    return 0;
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
            oi__grpc_finish_status(call, st);
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
            oi__grpc_reply(call, &r.base);
        }
        free(vals);
        free(ents);
        free(ptrs);
    }
    end_control(s, call, rc);
}

/* LogSettings: the settings to change go to the application's handler as typed parameters (a
 * value left unset as an empty string, which fails the handler's type check). */
void oi__grpc_log_settings_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
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
        oi__grpc_finish_status(call, st);
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
            oi__grpc_finish_status(call, st);
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
            oi__grpc_reply(call, &r.base);
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
void oi__grpc_trace_setting_rpc(oi_server_t *s, oi_grpc_call_t *call, const oi_buf_t *msg)
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
        oi__grpc_finish_status(call, st);
    }
}
