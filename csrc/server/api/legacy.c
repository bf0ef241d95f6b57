#include "server/api/legacy.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "codec/pbtext.h"
#include "server/sched/scheduler.h"

#define PB(x) Nvidia__Inferenceserver__##x

/* The package's version, which setup.py defines (builds outside it, such as the fuzz targets',
 * have none). */
#ifndef OI_VERSION
#define OI_VERSION ""
#endif

/* ---- an arena for the messages of one answer ---------------------------------------------- */

typedef struct block_s {
    struct block_s *next;
    max_align_t data[];
} block_t;

/* A bump allocator: the messages of an answer are many and small, and all die together. The
 * first 4 KiB live in the arena itself (on the caller's stack). */
typedef struct arena_s {
    block_t *head;
    size_t used, cap;
    char *cur;
    max_align_t first[4096 / sizeof(max_align_t)];
} arena_t;

#define ARENA_INIT(a) ((a).head = NULL, (a).used = 0, (a).cap = sizeof((a).first), (a).cur = (char *)(a).first)

static void *arena_new(arena_t *a, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);
    if (a->cap - a->used < n) {
        size_t cap = n > 8192 ? n : 8192;
        block_t *b = malloc(sizeof(*b) + cap);
        if (b == NULL)
            return NULL;
        b->next = a->head;
        a->head = b;
        a->cur = (char *)b->data;
        a->used = 0;
        a->cap = cap;
    }
    void *p = a->cur + a->used;
    a->used += n;
    memset(p, 0, n);
    return p;
}

static void arena_free(arena_t *a)
{
    while (a->head != NULL) {
        block_t *b = a->head;
        a->head = b->next;
        free(b);
    }
}

/* A zeroed message of type T set to its INIT, or NULL. */
#define NEW(a, T, INIT) init_msg(arena_new((a), sizeof(T)), &(T)INIT, sizeof(T))
static void *init_msg(void *p, const void *init, size_t n)
{
    if (p != NULL)
        memcpy(p, init, n);
    return p;
}

/* ---- status ------------------------------------------------------------------------------- */

uint64_t oi_legacy_next_id(oi_server_t *s)
{
    return atomic_fetch_add(&s->legacy_ids, 1) + 1;
}

void oi_legacy_status_fill(oi_legacy_status_t *rs, const oi_status_t *st, uint64_t request_id)
{
    *rs = (oi_legacy_status_t)NVIDIA__INFERENCESERVER__REQUEST_STATUS__INIT;
    rs->server_id = OI_LEGACY_SERVER_ID;
    rs->request_id = request_id;
    if (st == NULL) {
        rs->code = NVIDIA__INFERENCESERVER__REQUEST_STATUS_CODE__SUCCESS;
        return;
    }
    rs->msg = st->message;
    switch (st->code) {
    case OI_BAD_REQUEST:
    case OI_TOO_LARGE:
    case OI_UNSUPPORTED_MEDIA: rs->code = NVIDIA__INFERENCESERVER__REQUEST_STATUS_CODE__INVALID_ARG; break;
    case OI_NOT_FOUND: rs->code = NVIDIA__INFERENCESERVER__REQUEST_STATUS_CODE__NOT_FOUND; break;
    case OI_UNAVAILABLE: rs->code = NVIDIA__INFERENCESERVER__REQUEST_STATUS_CODE__UNAVAILABLE; break;
    case OI_UNIMPLEMENTED:
    case OI_METHOD_NOT_ALLOWED: rs->code = NVIDIA__INFERENCESERVER__REQUEST_STATUS_CODE__UNSUPPORTED; break;
    case OI_INTERNAL: rs->code = NVIDIA__INFERENCESERVER__REQUEST_STATUS_CODE__INTERNAL; break;
    case 409:
    case OI_TRITON_ALREADY_EXISTS: rs->code = NVIDIA__INFERENCESERVER__REQUEST_STATUS_CODE__ALREADY_EXISTS; break;
    case 429: rs->code = NVIDIA__INFERENCESERVER__REQUEST_STATUS_CODE__UNAVAILABLE; break;
    default: rs->code = NVIDIA__INFERENCESERVER__REQUEST_STATUS_CODE__UNKNOWN; break;
    }
}

int oi_legacy_health(oi_server_t *s, int ready)
{
    if (atomic_load(&s->stopping))
        return 0;
    return ready ? s->cfg.lax_readiness || oi_registry_all_ready(&s->registry) : 1;
}

int oi_legacy_write(oi_sbuf_t *out, const ProtobufCMessage *m, oi_legacy_format_t fmt, int one_line)
{
    if (fmt == OI_LEGACY_JSON)
        return oi_pbjson_write(out, m);
    if (fmt == OI_LEGACY_TEXT)
        return oi_pbtext_write(out, m, one_line);
    size_t n = protobuf_c_message_get_packed_size(m);
    if (oi_sbuf_reserve(out, n + 1) != 0)
        return -1;
    out->len += protobuf_c_message_pack(m, (uint8_t *)out->data + out->len);
    return 0;
}

/* ---- server status ------------------------------------------------------------------------ */

typedef struct collect_s {
    oi_model_t **models;
    size_t n, cap;
} collect_t;

static int take(void *ctx, oi_model_t *m)
{
    collect_t *c = ctx;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 16;
        oi_model_t **grown = realloc(c->models, cap * sizeof(*grown));
        if (grown == NULL)
            return -1;
        c->models = grown;
        c->cap = cap;
    }
    oi_model_ref(m);
    c->models[c->n++] = m;
    return 0;
}

static int by_name_version(const void *a, const void *b)
{
    const oi_model_t *x = *(oi_model_t *const *)a, *y = *(oi_model_t *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->version > y->version) - (x->version < y->version);
}

static PB(StatDuration) * duration(arena_t *a, uint64_t count, uint64_t ns)
{
    PB(StatDuration) *d = NEW(a, PB(StatDuration), NVIDIA__INFERENCESERVER__STAT_DURATION__INIT);
    if (d != NULL) {
        d->count = count;
        d->total_time_ns = ns;
    }
    return d;
}

/* One entry of infer_stats: 1.x keyed them by batch size. The compute time of each batch size
 * comes from V2's batch statistics; success, failure and queue time are counted per request
 * but not per batch size, so they go with the entry of batch size 0 ("any"), or of 1 on a
 * model that does not batch (where every request is batch 1). */
static PB(ModelVersionStatus__InferStatsEntry) *
    stats_entry(arena_t *a, uint32_t key, const oi_stats_snapshot_t *s, const oi_batch_stats_t *b)
{
    PB(ModelVersionStatus__InferStatsEntry) *e =
        NEW(a, PB(ModelVersionStatus__InferStatsEntry),
            NVIDIA__INFERENCESERVER__MODEL_VERSION_STATUS__INFER_STATS_ENTRY__INIT);
    PB(InferRequestStats) *v = NEW(a, PB(InferRequestStats), NVIDIA__INFERENCESERVER__INFER_REQUEST_STATS__INIT);
    if (e == NULL || v == NULL)
        return NULL;
    e->key = key;
    e->value = v;
    if (b != NULL) {
        v->compute =
            duration(a, b->compute_infer.count, b->compute_input.ns + b->compute_infer.ns + b->compute_output.ns);
        if (v->compute == NULL)
            return NULL;
    }
    if (s != NULL) {
        v->success = duration(a, s->success.count, s->success.ns);
        v->failed = duration(a, s->fail.count, s->fail.ns);
        v->queue = duration(a, s->queue.count, s->queue.ns);
        if (b == NULL)
            v->compute =
                duration(a, s->compute_infer.count, s->compute_input.ns + s->compute_infer.ns + s->compute_output.ns);
        if (v->success == NULL || v->failed == NULL || v->queue == NULL || v->compute == NULL)
            return NULL;
    }
    return e;
}

static PB(ModelVersionStatus) * version_status(arena_t *a, const oi_model_t *m)
{
    PB(ModelVersionStatus) *vs = NEW(a, PB(ModelVersionStatus), NVIDIA__INFERENCESERVER__MODEL_VERSION_STATUS__INIT);
    if (vs == NULL)
        return NULL;
    if (m->error != NULL || m->sched == NULL) {
        vs->ready_state = NVIDIA__INFERENCESERVER__MODEL_READY_STATE__MODEL_UNAVAILABLE;
        vs->ready_state_reason =
            NEW(a, PB(ModelReadyStateReason), NVIDIA__INFERENCESERVER__MODEL_READY_STATE_REASON__INIT);
        if (vs->ready_state_reason == NULL)
            return NULL;
        vs->ready_state_reason->message = m->error ? m->error : "no executor";
        return vs;
    }
    vs->ready_state = NVIDIA__INFERENCESERVER__MODEL_READY_STATE__MODEL_READY;
    oi_stats_snapshot_t snap;
    const oi_stats_t *st = oi_scheduler_stats(m->sched);
    if (st == NULL || oi_stats_read(st, &snap) != 0)
        return vs;
    vs->model_execution_count = snap.execution_count;
    vs->model_inference_count = snap.inference_count;
    vs->last_inference_timestamp_milliseconds = snap.last_inference_ms;
    int batching = m->max_batch_size > 0;
    size_t n = snap.n_batches + (batching ? 1 : 0);
    if (!batching && snap.n_batches == 0 && snap.success.count + snap.fail.count == 0)
        n = 0;
    if (!batching && n == 0 && snap.success.count + snap.fail.count > 0)
        n = 1;
    vs->infer_stats = n ? arena_new(a, n * sizeof(*vs->infer_stats)) : NULL;
    if (n && vs->infer_stats == NULL) {
        oi_stats_snapshot_clear(&snap);
        return NULL;
    }
    size_t k = 0;
    if (batching) {
        vs->infer_stats[k++] = stats_entry(a, 0, &snap, NULL);
        for (size_t i = 0; i < snap.n_batches; i++)
            vs->infer_stats[k++] = stats_entry(a, (uint32_t)snap.batches[i].batch_size, NULL, &snap.batches[i]);
    } else if (n > 0) {
        vs->infer_stats[k++] = stats_entry(a, 1, &snap, NULL);
    }
    vs->n_infer_stats = k;
    oi_stats_snapshot_clear(&snap);
    for (size_t i = 0; i < k; i++)
        if (vs->infer_stats[i] == NULL)
            return NULL;
    return vs;
}

/* The configuration as 1.x's ModelConfig: V2's ModelConfig kept every 1.x field number and
 * type, so the V2 bytes read as the 1.x message (fields 1.x lacks are left aside). */
static PB(ModelConfig) * legacy_config(arena_t *a, const oi_model_t *m, PB(ModelConfig) * *unpacked)
{
    if (m->config_pb != NULL) {
        *unpacked =
            nvidia__inferenceserver__model_config__unpack(NULL, m->config_pb->len, (const uint8_t *)m->config_pb->data);
        if (*unpacked != NULL)
            return *unpacked;
    }
    PB(ModelConfig) *c = NEW(a, PB(ModelConfig), NVIDIA__INFERENCESERVER__MODEL_CONFIG__INIT);
    if (c != NULL) {
        c->name = m->name;
        c->max_batch_size = m->max_batch_size;
    }
    return c;
}

oi_status_t *oi_legacy_server_status(oi_server_t *s, const char *model, oi_legacy_format_t fmt, oi_sbuf_t *out)
{
    collect_t c = {0};
    const char *name = model != NULL && model[0] != '\0' ? model : NULL;
    if (oi_registry_visit(&s->registry, name, take, &c) != 0) {
        for (size_t i = 0; i < c.n; i++)
            oi_model_unref(c.models[i]);
        free(c.models);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    if (name != NULL && c.n == 0) {
        free(c.models);
        return oi_status_new(OI_NOT_FOUND, "no status available for unknown model '%s'", name);
    }
    if (c.n > 1)
        qsort(c.models, c.n, sizeof(*c.models), by_name_version);
    arena_t a;
    ARENA_INIT(a);
    PB(ModelConfig) **unpacked = calloc(c.n + 1, sizeof(*unpacked));
    PB(ServerStatus) ss = NVIDIA__INFERENCESERVER__SERVER_STATUS__INIT;
    ss.id = OI_LEGACY_SERVER_ID;
    ss.version = OI_VERSION;
    ss.ready_state = atomic_load(&s->stopping) ? NVIDIA__INFERENCESERVER__SERVER_READY_STATE__SERVER_EXITING
                                               : NVIDIA__INFERENCESERVER__SERVER_READY_STATE__SERVER_READY;
    ss.uptime_ns = oi_now_ns() - s->start_ns;
    ss.model_status = arena_new(&a, (c.n + 1) * sizeof(*ss.model_status));
    int ok = unpacked != NULL && ss.model_status != NULL;
    for (size_t i = 0; i < c.n && ok;) {
        size_t j = i;
        while (j < c.n && strcmp(c.models[j]->name, c.models[i]->name) == 0)
            j++;
        PB(ServerStatus__ModelStatusEntry) *e = NEW(&a, PB(ServerStatus__ModelStatusEntry),
                                                    NVIDIA__INFERENCESERVER__SERVER_STATUS__MODEL_STATUS_ENTRY__INIT);
        PB(ModelStatus) *ms = NEW(&a, PB(ModelStatus), NVIDIA__INFERENCESERVER__MODEL_STATUS__INIT);
        ok = e != NULL && ms != NULL;
        if (!ok)
            break;
        e->key = c.models[i]->name;
        e->value = ms;
        /* The configuration of the highest ready version, else of the highest. */
        const oi_model_t *shown = c.models[j - 1];
        for (size_t k = i; k < j; k++)
            if (c.models[k]->error == NULL)
                shown = c.models[k];
        ms->config = legacy_config(&a, shown, &unpacked[i]);
        ms->version_status = arena_new(&a, (j - i) * sizeof(*ms->version_status));
        ok = ms->config != NULL && ms->version_status != NULL;
        for (size_t k = i; k < j && ok; k++) {
            PB(ModelStatus__VersionStatusEntry) *ve =
                NEW(&a, PB(ModelStatus__VersionStatusEntry),
                    NVIDIA__INFERENCESERVER__MODEL_STATUS__VERSION_STATUS_ENTRY__INIT);
            ok = ve != NULL && (ve->value = version_status(&a, c.models[k])) != NULL;
            if (ok) {
                ve->key = c.models[k]->version;
                ms->version_status[ms->n_version_status++] = ve;
            }
        }
        ss.model_status[ss.n_model_status++] = e;
        i = j;
    }
    if (ok)
        ok = oi_legacy_write(out, &ss.base, fmt, 0) == 0;
    for (size_t i = 0; unpacked != NULL && i < c.n; i++)
        if (unpacked[i] != NULL)
            nvidia__inferenceserver__model_config__free_unpacked(unpacked[i], NULL);
    free(unpacked);
    arena_free(&a);
    for (size_t i = 0; i < c.n; i++)
        oi_model_unref(c.models[i]);
    free(c.models);
    return ok ? NULL : oi_status_new(OI_INTERNAL, "out of memory");
}

/* ---- inference ---------------------------------------------------------------------------- */

oi_legacy_infer_t *oi_legacy_infer_new(oi_legacy_req_header_t *hdr, uint64_t request_id)
{
    oi_legacy_infer_t *li = calloc(1, sizeof(*li));
    if (li == NULL || (li->inf = oi_infer_new()) == NULL) {
        free(li);
        protobuf_c_message_free_unpacked(&hdr->base, NULL);
        return NULL;
    }
    li->hdr = hdr;
    li->request_id = request_id;
    li->inf->ctx = li;
    return li;
}

void oi_legacy_infer_free(oi_legacy_infer_t *li)
{
    if (li == NULL)
        return;
    oi_infer_free(li->inf);
    for (size_t i = 0; li->topk != NULL && i < li->hdr->n_output; i++)
        oi_topk_free(&li->topk[i]);
    free(li->topk);
    free(li->cls);
    protobuf_c_message_free_unpacked(&li->hdr->base, NULL);
    free(li);
}

static const oi_io_spec_t *find_spec(const oi_io_spec_t *specs, uint32_t n, const char *name)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(specs[i].name, name) == 0)
            return &specs[i];
    return NULL;
}

/* The byte size of `count` BYTES elements starting at p (at most `avail` bytes), or -1 when
 * they run past it. */
static int64_t bytes_size(const char *p, size_t avail, int64_t count)
{
    size_t off = 0;
    for (int64_t i = 0; i < count; i++) {
        uint32_t n;
        if (avail - off < 4)
            return -1;
        memcpy(&n, p + off, 4);
        off += 4;
        if (avail - off < n)
            return -1;
        off += n;
    }
    return (int64_t)off;
}

/* Ranks the classes of the cls outputs, on the executor thread. */
static oi_status_t *rank_classes(oi_infer_t *inf)
{
    oi_legacy_infer_t *li = inf->ctx;
    for (uint32_t i = 0; i < li->hdr->n_output && i < inf->job.resp.n_outputs; i++) {
        if (li->cls[i] == 0)
            continue;
        oi_status_t *st =
            oi_classify_rank(&inf->job.resp.outputs[i], inf->model->max_batch_size > 0, li->cls[i], &li->topk[i]);
        if (st != NULL)
            return st;
    }
    return NULL;
}

/* The shared_memory of the header's inputs (flagged in `shm_in`) and outputs, as the V2
 * parameters oi_shm_resolve reads ("shared_memory_region", "_offset", "_byte_size"), written
 * into the request's aux buffer. */
static oi_status_t *shm_parameters(oi_legacy_infer_t *li, const uint8_t *shm_in)
{
    const oi_legacy_req_header_t *h = li->hdr;
    oi_request_t *req = &li->inf->req;
    size_t n = h->n_input + h->n_output;
    size_t *off = calloc(n + 1, sizeof(*off)), *len = calloc(n + 1, sizeof(*len));
    oi_sbuf_t aux = {0};
    int rc = off == NULL || len == NULL, any = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const PB(InferSharedMemory) *sm =
            i < h->n_input ? (shm_in[i] ? h->input[i]->shared_memory : NULL) : h->output[i - h->n_input]->shared_memory;
        if (sm == NULL)
            continue;
        any = 1;
        off[i] = aux.len;
        rc |= oi_sbuf_append(&aux, "{\"shared_memory_region\":", 24);
        rc |= oi_json_write_string(&aux, sm->name, strlen(sm->name));
        rc |= oi_sbuf_printf(&aux, ",\"shared_memory_offset\":%" PRIu64 ",\"shared_memory_byte_size\":%" PRIu64 "}",
                             sm->offset, sm->byte_size);
        len[i] = aux.len - off[i];
        rc |= oi_sbuf_append(&aux, "", 1);
    }
    oi_buf_t *b = !rc && any ? oi_sbuf_detach(&aux) : NULL;
    if (!rc && any && b == NULL)
        rc = 1;
    if (b != NULL) {
        req->aux = b;
        uint32_t k = 0;
        for (size_t i = 0; i < h->n_input; i++) {
            /* req->inputs follow the header's inputs one for one. */
            if (shm_in[i])
                req->inputs[k].parameters = (oi_slice_t){b->data + off[i], len[i]};
            k++;
        }
        for (size_t i = 0; i < h->n_output; i++)
            if (h->output[i]->shared_memory != NULL)
                req->outputs[i].parameters = (oi_slice_t){b->data + off[h->n_input + i], len[h->n_input + i]};
    }
    oi_sbuf_free(&aux);
    free(off);
    free(len);
    return rc ? oi_status_new(OI_INTERNAL, "out of memory") : NULL;
}

oi_status_t *oi_legacy_decode(oi_legacy_infer_t *li, const oi_model_t *m, oi_buf_t *owner, const char *data, size_t len,
                              const ProtobufCBinaryData *raw, size_t n_raw)
{
    const oi_legacy_req_header_t *h = li->hdr;
    oi_request_t *req = &li->inf->req;
    int batching = m->max_batch_size > 0;
    uint8_t shm_slots[h->n_input + 1];
    memset(shm_slots, 0, sizeof(shm_slots));
    if (batching ? (h->batch_size < 1 || h->batch_size > (uint32_t)m->max_batch_size) : h->batch_size > 1)
        return oi_status_new(OI_BAD_REQUEST, "batch_size: expected 1 to %d for model '%s', got %" PRIu32,
                             batching ? m->max_batch_size : 1, m->name, h->batch_size);
    if (raw != NULL && n_raw != h->n_input)
        return oi_status_new(OI_BAD_REQUEST, "expected %zu raw_input entries, one per input of the header, got %zu",
                             h->n_input, n_raw);
    size_t off = 0;
    for (size_t i = 0; i < h->n_input; i++) {
        const PB(InferRequestHeader__Input) *in = h->input[i];
        const oi_io_spec_t *spec = find_spec(m->inputs, m->n_inputs, in->name);
        if (spec == NULL)
            return oi_status_new(OI_BAD_REQUEST, "unexpected inference input '%s' for model '%s'", in->name, m->name);
        oi_tensor_t *t = oi_tensor_push(&req->inputs, &req->n_inputs);
        if (t == NULL)
            return oi_status_new(OI_INTERNAL, "out of memory");
        t->name = in->name;
        t->dtype = spec->dtype;
        int first = batching ? 1 : 0;
        size_t ndims = in->n_dims ? in->n_dims : (size_t)(spec->ndim > first ? spec->ndim - first : 0);
        if (ndims + (size_t)first > OI_MAX_DIMS)
            return oi_status_new(OI_BAD_REQUEST, "input '%s': more than %d dims", in->name, OI_MAX_DIMS);
        t->ndim = (int)ndims + first;
        if (batching)
            t->shape[0] = h->batch_size;
        for (size_t d = 0; d < ndims; d++) {
            t->shape[first + d] = in->n_dims ? in->dims[d] : spec->dims[first + d];
            if (t->shape[first + d] < 0)
                return oi_status_new(OI_BAD_REQUEST,
                                     "input '%s': the model's dims are variable; give this input's dims in the "
                                     "request header",
                                     in->name);
        }
        int64_t count;
        if (oi_shape_elements(t->shape, t->ndim, &count) != 0)
            return oi_status_new(OI_BAD_REQUEST, "input '%s': shape too large", in->name);
        if (in->shared_memory != NULL) { /* its bytes are in a registered region, not the body */
            t->shm = 1;
            shm_slots[i] = 1;
            continue;
        }
        const char *at = raw ? (const char *)raw[i].data : data != NULL ? data + off : NULL;
        size_t avail = raw ? raw[i].len : len - off;
        int64_t size;
        if (spec->dtype == OI_TYPE_BYTES)
            size = in->batch_byte_size ? (int64_t)in->batch_byte_size : bytes_size(at, avail, count);
        else
            size = count * (int64_t)oi_dtype_size(spec->dtype);
        if (size >= 0 && in->batch_byte_size && (uint64_t)size != in->batch_byte_size)
            return oi_status_new(OI_BAD_REQUEST,
                                 "input '%s': batch_byte_size %" PRIu64 " differs from the %lld bytes its shape needs",
                                 in->name, in->batch_byte_size, (long long)size);
        if (size < 0 || (uint64_t)size > avail || (raw && (uint64_t)size != avail))
            return oi_status_new(OI_BAD_REQUEST,
                                 "unexpected size for input '%s', expecting %s%lld bytes for model '%s', got %zu%s",
                                 in->name, size < 0 ? "more than " : "", (long long)(size < 0 ? (int64_t)avail : size),
                                 m->name, avail, raw ? "" : " (what the body has left)");
        t->data = size > 0 ? (char *)at : NULL;
        t->byte_size = (size_t)size;
        t->owner = size > 0 ? oi_buf_ref(owner) : NULL;
        off += (size_t)size;
        oi_status_t *st = oi_tensor_check_size(t, "input", in->name);
        if (st != NULL)
            return st;
    }
    if (raw == NULL && off != len)
        return oi_status_new(OI_BAD_REQUEST,
                             "unexpected additional input data for model '%s': the body has %zu bytes, the inputs "
                             "of the header take %zu",
                             m->name, len, off);
    req->body = owner != NULL ? oi_buf_ref(owner) : NULL;
    size_t n_out = h->n_output;
    li->cls = calloc(n_out + 1, sizeof(*li->cls));
    li->topk = calloc(n_out + 1, sizeof(*li->topk));
    req->outputs = calloc(n_out + 1, sizeof(*req->outputs));
    if (li->cls == NULL || li->topk == NULL || req->outputs == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    int any_cls = 0;
    for (size_t i = 0; i < n_out; i++) {
        const PB(InferRequestHeader__Output) *o = h->output[i];
        const oi_io_spec_t *spec = find_spec(m->outputs, m->n_outputs, o->name);
        if (spec == NULL)
            return oi_status_new(OI_BAD_REQUEST, "unexpected inference output '%s' for model '%s'", o->name, m->name);
        req->outputs[i] = (oi_output_request_t){.name = o->name, .binary_data = -1};
        if (o->shared_memory != NULL && o->cls != NULL && o->cls->count > 0)
            return oi_status_new(OI_BAD_REQUEST, "output '%s': cls and shared_memory exclude each other", o->name);
        if (o->cls != NULL && o->cls->count > 0) {
            oi_status_t *st = oi_classify_check_dtype(spec->dtype, o->name);
            if (st != NULL)
                return st;
            li->cls[i] = o->cls->count;
            any_cls = 1;
        }
    }
    req->n_outputs = (uint32_t)n_out;
    if (any_cls)
        li->inf->post = rank_classes;
    oi_status_t *st = shm_parameters(li, shm_slots);
    return st != NULL ? st : oi_request_check_unique(req, "input");
}

/* The classes of one row of a cls output. */
static PB(InferResponseHeader__Output__Classes) *
    row_classes(arena_t *a, const oi_tensor_t *t, const oi_topk_t *r, int64_t row, const oi_labels_t *labels)
{
    PB(InferResponseHeader__Output__Classes) *c =
        NEW(a, PB(InferResponseHeader__Output__Classes),
            NVIDIA__INFERENCESERVER__INFER_RESPONSE_HEADER__OUTPUT__CLASSES__INIT);
    if (c == NULL || (c->cls = arena_new(a, (r->kept + 1) * sizeof(*c->cls))) == NULL)
        return NULL;
    for (uint32_t k = 0; k < r->kept; k++) {
        PB(InferResponseHeader__Output__Class) *cl =
            NEW(a, PB(InferResponseHeader__Output__Class),
                NVIDIA__INFERENCESERVER__INFER_RESPONSE_HEADER__OUTPUT__CLASS__INIT);
        if (cl == NULL)
            return NULL;
        uint32_t index = r->idx[(size_t)row * r->kept + k], label_len;
        const char *label = oi_labels_get(labels, index, &label_len);
        cl->idx = (int32_t)index;
        cl->value = (float)oi_classify_score(t, oi_classify_elem(t, r, row, k));
        if (label != NULL) {
            char *copy = arena_new(a, label_len + 1);
            if (copy == NULL)
                return NULL;
            memcpy(copy, label, label_len);
            cl->label = copy;
        }
        c->cls[c->n_cls++] = cl;
    }
    return c;
}

static const oi_labels_t *labels_of(const oi_model_t *m, const char *name)
{
    for (uint32_t o = 0; m->labels != NULL && o < m->n_outputs; o++)
        if (strcmp(m->outputs[o].name, name) == 0)
            return m->labels[o];
    return NULL;
}

int oi_legacy_response_header(const oi_legacy_infer_t *li, oi_legacy_format_t fmt, oi_sbuf_t *out, oi_sbuf_t *line)
{
    const oi_model_t *m = li->inf->model;
    const oi_response_t *resp = &li->inf->job.resp;
    int batching = m->max_batch_size > 0;
    arena_t a;
    ARENA_INIT(a);
    oi_legacy_resp_header_t rh = NVIDIA__INFERENCESERVER__INFER_RESPONSE_HEADER__INIT;
    rh.id = li->hdr->id;
    rh.model_name = m->name;
    rh.model_version = m->version;
    rh.batch_size = li->hdr->batch_size;
    size_t n = li->hdr->n_output < resp->n_outputs ? li->hdr->n_output : resp->n_outputs;
    rh.output = arena_new(&a, (n + 1) * sizeof(*rh.output));
    int ok = rh.output != NULL;
    for (size_t i = 0; i < n && ok; i++) {
        const oi_tensor_t *t = &resp->outputs[i];
        PB(InferResponseHeader__Output) *o =
            NEW(&a, PB(InferResponseHeader__Output), NVIDIA__INFERENCESERVER__INFER_RESPONSE_HEADER__OUTPUT__INIT);
        if ((ok = o != NULL) == 0)
            break;
        o->name = (char *)t->name;
        if (li->cls[i] == 0) {
            PB(InferResponseHeader__Output__Raw) *r =
                NEW(&a, PB(InferResponseHeader__Output__Raw),
                    NVIDIA__INFERENCESERVER__INFER_RESPONSE_HEADER__OUTPUT__RAW__INIT);
            ok = r != NULL;
            if (ok && t->ndim > batching) {
                /* 1.x gives the dims of one batch entry and the whole batch's byte size. */
                r->n_dims = (size_t)(t->ndim - batching);
                r->dims = (int64_t *)(t->shape + batching);
            }
            if (ok)
                r->batch_byte_size = t->byte_size;
            o->raw = r;
        } else {
            const oi_topk_t *r = &li->topk[i];
            o->batch_classes = arena_new(&a, ((size_t)r->rows + 1) * sizeof(*o->batch_classes));
            ok = o->batch_classes != NULL;
            for (int64_t row = 0; row < r->rows && ok; row++)
                ok = (o->batch_classes[o->n_batch_classes++] = row_classes(&a, t, r, row, labels_of(m, t->name))) !=
                     NULL;
        }
        rh.output[rh.n_output++] = o;
    }
    if (ok && line != NULL)
        ok = oi_pbtext_write(line, &rh.base, 1) == 0;
    if (ok)
        ok = oi_legacy_write(out, &rh.base, fmt, 0) == 0;
    arena_free(&a);
    return ok ? 0 : -1;
}

int oi_legacy_error_header(const oi_legacy_infer_t *li, oi_sbuf_t *out)
{
    oi_legacy_resp_header_t rh = NVIDIA__INFERENCESERVER__INFER_RESPONSE_HEADER__INIT;
    rh.id = li != NULL ? li->hdr->id : 0;
    return oi_pbtext_write(out, &rh.base, 1);
}

/* ---- shared memory ------------------------------------------------------------------------ */

oi_status_t *oi_legacy_shm_status(oi_server_t *s, const oi_peer_t *peer, oi_legacy_format_t fmt, oi_sbuf_t *out,
                                  int wrap)
{
    oi_shm_region_t **regions = NULL;
    size_t n = 0;
    oi_status_t *st = oi_shm_list(&s->shm, peer, OI_SHM_SYSTEM, NULL, &regions, &n);
    if (st != NULL)
        return st;
    arena_t a;
    ARENA_INIT(a);
    PB(SharedMemoryStatus) ss = NVIDIA__INFERENCESERVER__SHARED_MEMORY_STATUS__INIT;
    ss.shared_memory_region = arena_new(&a, (n + 1) * sizeof(*ss.shared_memory_region));
    int ok = ss.shared_memory_region != NULL;
    for (size_t i = 0; i < n && ok; i++) {
        PB(SharedMemoryRegion) *r =
            NEW(&a, PB(SharedMemoryRegion), NVIDIA__INFERENCESERVER__SHARED_MEMORY_REGION__INIT);
        PB(SharedMemoryRegion__SystemSharedMemory) *sys =
            NEW(&a, PB(SharedMemoryRegion__SystemSharedMemory),
                NVIDIA__INFERENCESERVER__SHARED_MEMORY_REGION__SYSTEM_SHARED_MEMORY__INIT);
        if ((ok = r != NULL && sys != NULL) == 0)
            break;
        r->name = regions[i]->name;
        r->byte_size = regions[i]->byte_size;
        sys->shared_memory_key = regions[i]->key;
        sys->offset = regions[i]->offset;
        r->shared_memory_types_case =
            NVIDIA__INFERENCESERVER__SHARED_MEMORY_REGION__SHARED_MEMORY_TYPES_SYSTEM_SHARED_MEMORY;
        r->system_shared_memory = sys;
        ss.shared_memory_region[ss.n_shared_memory_region++] = r;
    }
    if (ok && wrap) { /* SharedMemoryControlResponse.shared_memory_status (2): Status, field 1 as here */
        PB(SharedMemoryControlResponse__Status)
        cs = NVIDIA__INFERENCESERVER__SHARED_MEMORY_CONTROL_RESPONSE__STATUS__INIT;
        cs.n_shared_memory_region = ss.n_shared_memory_region;
        cs.shared_memory_region = ss.shared_memory_region;
        ok = oi_legacy_write(out, &cs.base, fmt, 0) == 0;
    } else if (ok) {
        ok = oi_legacy_write(out, &ss.base, fmt, 0) == 0;
    }
    arena_free(&a);
    oi_shm_release_all(regions, n);
    return ok ? NULL : oi_status_new(OI_INTERNAL, "out of memory");
}
