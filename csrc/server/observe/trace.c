#include "server/observe/trace.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/recq.h"

/* Queued records: a power of two; at ~240 bytes each, 4096 is about 1 MiB. */
#define CAPACITY 4096
/* Models that may have settings of their own over a server's life. */
#define MAX_MODELS 256

/* One set of sampling settings; `count` and `seen` change as requests are sampled. */
typedef struct {
    atomic_int level;
    atomic_uint rate;
    atomic_int count;          /* traces still to take; -1: no limit */
    atomic_uint_fast64_t seen; /* requests sampled against `rate` */
} setting_t;

/* A model's own settings. Entries are only added (under `mu`) and published through
 * n_models; `own` says whether they apply now or the global ones do. */
typedef struct {
    char name[128];
    atomic_int own;
    setting_t set;
} model_setting_t;

struct oi_tracer_s {
    setting_t global;
    model_setting_t models[MAX_MODELS];
    atomic_int n_models;
    pthread_mutex_t mu; /* the control thread's changes */
    atomic_uint log_frequency;
    atomic_uint_fast64_t next_id;
    atomic_int flush; /* the settings changed: the writer flushes the file */
    oi_recq_t *queue; /* its thread is the writer */
    /* The writer's. */
    char path[4096];
    FILE *main;       /* path (log_frequency 0) */
    int main_started; /* "[" written to main */
    FILE *part;       /* path.<index> (log_frequency > 0) */
    int part_started; /* "[" written to part */
    unsigned index, in_part;
};

static model_setting_t *find_model(oi_tracer_t *t, const char *model)
{
    int n = atomic_load_explicit(&t->n_models, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (strcmp(t->models[i].name, model) == 0)
            return &t->models[i];
    return NULL;
}

static setting_t *setting_for(oi_tracer_t *t, const char *model)
{
    model_setting_t *m = model != NULL ? find_model(t, model) : NULL;
    return m != NULL && atomic_load_explicit(&m->own, memory_order_acquire) ? &m->set : &t->global;
}

static void apply(setting_t *s, int level, uint32_t rate, int32_t count)
{
    atomic_store(&s->rate, rate);
    atomic_store(&s->count, count);
    atomic_store(&s->seen, 0);
    atomic_store(&s->level, level);
}

int oi_tracer_set(oi_tracer_t *t, const char *model, int clear, int level, uint32_t rate, int32_t count,
                  uint32_t log_frequency)
{
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    if (model == NULL) {
        apply(&t->global, level, rate, count);
        atomic_store(&t->log_frequency, log_frequency);
    } else {
        model_setting_t *m = find_model(t, model);
        int n = atomic_load(&t->n_models);
        if (m == NULL && !clear && n < MAX_MODELS && strlen(model) < sizeof(m->name)) {
            m = &t->models[n];
            snprintf(m->name, sizeof(m->name), "%s", model);
            atomic_store_explicit(&t->n_models, n + 1, memory_order_release);
        } else if (m == NULL && !clear) {
            rc = -1;
        }
        if (m != NULL && clear)
            atomic_store_explicit(&m->own, 0, memory_order_release);
        else if (m != NULL) {
            apply(&m->set, level, rate, count);
            atomic_store_explicit(&m->own, 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&t->mu);
    atomic_store(&t->flush, 1);
    return rc;
}

int32_t oi_tracer_count(oi_tracer_t *t, const char *model)
{
    return atomic_load(&setting_for(t, model)->count);
}

uint64_t oi_tracer_sample(oi_tracer_t *t, const char *model, int *level)
{
    if (t == NULL)
        return 0;
    setting_t *s = setting_for(t, model);
    int lv = atomic_load_explicit(&s->level, memory_order_relaxed);
    if (!lv)
        return 0;
    uint32_t rate = atomic_load_explicit(&s->rate, memory_order_relaxed);
    if (rate == 0 || (atomic_fetch_add_explicit(&s->seen, 1, memory_order_relaxed) + 1) % rate != 0)
        return 0;
    int c = atomic_load_explicit(&s->count, memory_order_relaxed);
    while (c != -1) {
        if (c <= 0)
            return 0;
        if (atomic_compare_exchange_weak_explicit(&s->count, &c, c - 1, memory_order_relaxed, memory_order_relaxed))
            break;
    }
    *level = lv;
    return atomic_fetch_add_explicit(&t->next_id, 1, memory_order_relaxed) + 1;
}

void oi_trace_tensors_free(oi_trace_tensor_t *list)
{
    while (list != NULL) {
        oi_trace_tensor_t *next = list->next;
        free(list);
        list = next;
    }
}

int oi_trace_add_tensors(oi_trace_rec_t *rec, oi_trace_activity_t activity, const oi_tensor_t *tensors, uint32_t n)
{
    oi_trace_tensor_t **tail = &rec->tensors;
    while (*tail != NULL)
        tail = &(*tail)->next;
    for (uint32_t i = 0; i < n; i++) {
        const oi_tensor_t *src = &tensors[i];
        size_t name_len = strlen(src->name);
        oi_trace_tensor_t *c = malloc(sizeof(*c) + src->byte_size + name_len + 1);
        if (c == NULL)
            return -1;
        c->next = NULL;
        c->activity = activity;
        c->dtype = src->dtype;
        c->ndim = src->ndim;
        memcpy(c->shape, src->shape, sizeof(c->shape));
        c->byte_size = src->byte_size;
        if (src->byte_size)
            memcpy(c->data, src->data, src->byte_size);
        c->name = c->data + src->byte_size;
        memcpy(c->name, src->name, name_len + 1);
        *tail = c;
        tail = &c->next;
    }
    return 0;
}

void oi_tracer_push(oi_tracer_t *t, oi_trace_rec_t *rec)
{
    if (oi_recq_push(t->queue, rec) != 0)
        oi_trace_tensors_free(rec->tensors);
    rec->tensors = NULL;
}

/* ---- the writer ------------------------------------------------------------------------- */

static const char *const http_names[OI_TS_COUNT] = {
    "HTTP_RECV_START",      "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",     "COMPUTE_START", "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START", "COMPUTE_END",   "REQUEST_END",   "HTTP_SEND_START", "HTTP_SEND_END",
};

static const char *point_name(const oi_trace_rec_t *r, int i)
{
    if (!r->grpc)
        return http_names[i];
    switch (i) {
    case OI_TS_RECV_START: return "GRPC_WAITREAD_START";
    case OI_TS_RECV_END: return "GRPC_WAITREAD_END";
    case OI_TS_SEND_START: return "GRPC_SEND_START";
    case OI_TS_SEND_END: return "GRPC_SEND_END";
    default: return http_names[i];
    }
}

static void put_json_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
}

/* The length of the well-formed UTF-8 sequence (no overlong forms, surrogates or code points
 * past U+10FFFF) that starts `p`, or 0. */
static size_t utf8_length(const unsigned char *p, size_t avail)
{
    unsigned char c = p[0];
    size_t n = c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c < 0xF5 ? 4 : 0;
    if (n == 0 || n > avail)
        return 0;
    for (size_t k = 1; k < n; k++)
        if ((p[k] & 0xC0) != 0x80)
            return 0;
    if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] > 0x9F) || (c == 0xF0 && p[1] < 0x90) ||
        (c == 0xF4 && p[1] > 0x8F))
        return 0;
    return n;
}

/* A BYTES element as a JSON string inside the "data" string: Triton writes \"elem\"; the
 * element's own quotes, backslashes, control bytes and bytes that are not UTF-8 are escaped
 * twice over (Triton writes them raw, which can break the file), so that the data string
 * decodes to a comma-separated list of JSON strings. */
static void put_bytes_elem(FILE *f, const unsigned char *p, size_t len)
{
    fputs("\\\"", f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = p[i];
        if (c == '"' || c == '\\') {
            fputs(c == '"' ? "\\\\\\\"" : "\\\\\\\\", f); /* \" or \\ inside, escaped again */
            continue;
        }
        if (c >= 0x20 && c < 0x80) {
            fputc(c, f);
            continue;
        }
        /* A whole UTF-8 sequence passes as it is; any other byte becomes \u00XX. */
        size_t n = utf8_length(p + i, len - i);
        if (n != 0) {
            fwrite(p + i, 1, n, f);
            i += n - 1;
        } else {
            fprintf(f, "\\\\u%04x", c);
        }
    }
    fputs("\\\"", f);
}

/* One element of a fixed-width type, as a C++ stream prints it (floats with 6 significant
 * digits, booleans as 0/1), except INT8 and UINT8 written as numbers (Triton streams them as
 * characters). */
static void put_number(FILE *f, oi_dtype_t dtype, const void *v)
{
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
        float f32;
        double f64;
    } x;
    memcpy(&x, v, oi_dtype_size(dtype));
    switch (dtype) {
    case OI_TYPE_BOOL: fputc(x.u8 ? '1' : '0', f); break;
    case OI_TYPE_UINT8: fprintf(f, "%u", x.u8); break;
    case OI_TYPE_UINT16: fprintf(f, "%u", x.u16); break;
    case OI_TYPE_UINT32: fprintf(f, "%" PRIu32, x.u32); break;
    case OI_TYPE_UINT64: fprintf(f, "%" PRIu64, x.u64); break;
    case OI_TYPE_INT8: fprintf(f, "%d", x.i8); break;
    case OI_TYPE_INT16: fprintf(f, "%d", x.i16); break;
    case OI_TYPE_INT32: fprintf(f, "%" PRId32, x.i32); break;
    case OI_TYPE_INT64: fprintf(f, "%" PRId64, x.i64); break;
    case OI_TYPE_FP32: fprintf(f, "%g", (double)x.f32); break;
    case OI_TYPE_FP64: fprintf(f, "%g", x.f64); break;
    default: break;
    }
}

/* Triton's "data" text: the elements joined by commas; FP16 and BF16 left empty as Triton
 * leaves them. */
static void put_tensor_data(FILE *f, const oi_trace_tensor_t *t)
{
    int64_t count = 0;
    if (oi_shape_elements(t->shape, t->ndim, &count) != 0)
        return;
    size_t width = oi_dtype_size(t->dtype);
    if (t->dtype == OI_TYPE_FP16 || t->dtype == OI_TYPE_BF16 || (width != 0 && (uint64_t)count * width > t->byte_size))
        return;
    const unsigned char *p = (const unsigned char *)t->data;
    size_t off = 0;
    for (int64_t e = 0; e < count; e++) {
        if (e)
            fputc(',', f);
        if (t->dtype != OI_TYPE_BYTES) {
            put_number(f, t->dtype, p + (size_t)e * width);
            continue;
        }
        uint32_t len;
        if (off + 4 > t->byte_size)
            return;
        memcpy(&len, p + off, 4);
        off += 4;
        if (len > t->byte_size - off)
            return;
        put_bytes_elem(f, p + off, len);
        off += len;
    }
}

/* Starts the next object of the file: `*sep` ('[' for the file's first, else ',') first. */
static void open_object(FILE *f, char *sep)
{
    fputc(*sep, f);
    *sep = ',';
}

/* Triton's tensor record: {"id":N,"activity":"TENSOR_QUEUE_INPUT","tensor":{"name":..,
 * "data":"1,2,3","shape":"1,3","dtype":"INT32"}}. */
static void write_tensor(FILE *f, char *sep, uint64_t id, const oi_trace_tensor_t *t)
{
    open_object(f, sep);
    fprintf(f, "{\"id\":%" PRIu64 ",\"activity\":\"%s\",\"tensor\":{\"name\":\"", id,
            t->activity == OI_TRACE_QUEUE_INPUT ? "TENSOR_QUEUE_INPUT" : "TENSOR_BACKEND_OUTPUT");
    put_json_text(f, t->name);
    fputs("\",\"data\":\"", f);
    put_tensor_data(f, t);
    fputs("\",\"shape\":\"", f);
    for (int i = 0; i < t->ndim; i++)
        fprintf(f, i ? ",%" PRId64 : "%" PRId64, t->shape[i]);
    fprintf(f, "\",\"dtype\":\"%s\"}}", oi_dtype_name(t->dtype));
}

/* The tensors of `activity`, in the order they were taken. */
static void write_tensors(FILE *f, char *sep, const oi_trace_rec_t *r, oi_trace_activity_t activity)
{
    for (const oi_trace_tensor_t *t = r->tensors; t != NULL; t = t->next)
        if (t->activity == activity)
            write_tensor(f, sep, r->id, t);
}

/* Triton's layout: with TIMESTAMPS, the request's details, then one object per timestamp;
 * with TENSORS, one object per tensor where Triton reports it (the inputs as the request is
 * queued, the outputs as the response is sent). */
static void write_rec(FILE *f, char *sep, const oi_trace_rec_t *r)
{
    int stamps = r->level & OI_TRACE_TIMESTAMPS;
    if (stamps) {
        open_object(f, sep);
        fprintf(f, "{\"id\":%" PRIu64 ",\"model_name\":\"", r->id);
        put_json_text(f, r->model_name);
        fprintf(f, "\",\"model_version\":%" PRId64 "}", r->model_version);
    }
    for (int i = 0; i < OI_TS_COUNT; i++) {
        if (stamps && r->ns[i] != 0) {
            open_object(f, sep);
            fprintf(f, "{\"id\":%" PRIu64 ",\"timestamps\":[{\"name\":\"%s\",\"ns\":%" PRIu64 "}]}", r->id,
                    point_name(r, i), r->ns[i]);
        }
        if (i == OI_TS_QUEUE_START)
            write_tensors(f, sep, r, OI_TRACE_QUEUE_INPUT);
        else if (i == OI_TS_COMPUTE_OUTPUT_START)
            write_tensors(f, sep, r, OI_TRACE_BACKEND_OUTPUT);
    }
}

/* Appends a record to the file the log frequency picks: the one file, or the current index
 * file, which is closed (a whole JSON array) once it holds log_frequency traces. */
static void save(oi_tracer_t *t, const oi_trace_rec_t *r)
{
    unsigned freq = atomic_load(&t->log_frequency);
    if (freq == 0) {
        char sep = t->main_started ? ',' : '[';
        write_rec(t->main, &sep, r);
        t->main_started |= sep == ',';
        return;
    }
    if (t->part == NULL) {
        char name[sizeof(t->path) + 16];
        snprintf(name, sizeof(name), "%s.%u", t->path, t->index);
        t->part = fopen(name, "we");
        if (t->part == NULL)
            return; /* the index file cannot be written: the trace is lost */
        t->in_part = 0;
        t->part_started = 0;
    }
    char sep = t->part_started ? ',' : '[';
    write_rec(t->part, &sep, r);
    t->part_started |= sep == ',';
    if (++t->in_part >= freq) {
        fputs(t->part_started ? "]" : "[]", t->part);
        fclose(t->part);
        t->part = NULL;
        t->index++;
    }
}

static void write_queued(void *ctx, void *rec)
{
    oi_trace_rec_t *r = rec;
    save(ctx, r);
    oi_trace_tensors_free(r->tensors);
}

/* After each pass of the writer: the files flushed when the settings changed. */
static void after_pass(void *ctx, size_t n)
{
    oi_tracer_t *t = ctx;
    (void)n;
    if (atomic_exchange(&t->flush, 0)) {
        fflush(t->main);
        if (t->part != NULL)
            fflush(t->part);
    }
}

oi_tracer_t *oi_tracer_open(const char *path, char *err, size_t errlen)
{
    oi_tracer_t *t = calloc(1, sizeof(*t));
    if (t != NULL)
        t->queue = oi_recq_new(CAPACITY, sizeof(oi_trace_rec_t));
    if (t == NULL || t->queue == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (strlen(path) >= sizeof(t->path)) {
        snprintf(err, errlen, "the trace file's path is too long");
        goto fail;
    }
    snprintf(t->path, sizeof(t->path), "%s", path);
    atomic_store(&t->global.count, -1);
    pthread_mutex_init(&t->mu, NULL);
    t->main = fopen(path, "we");
    if (t->main == NULL) {
        snprintf(err, errlen, "cannot open the trace file %s: %s", path, strerror(errno));
        pthread_mutex_destroy(&t->mu);
        goto fail;
    }
    int rc = oi_recq_consume(t->queue, write_queued, after_pass, t);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the trace writer: %s", strerror(rc));
        fclose(t->main);
        pthread_mutex_destroy(&t->mu);
        goto fail;
    }
    return t;
fail:
    if (t != NULL)
        oi_recq_free(t->queue);
    free(t);
    return NULL;
}

void oi_tracer_close(oi_tracer_t *t)
{
    if (t == NULL)
        return;
    oi_recq_stop(t->queue);
    if (t->part != NULL) {
        fputs(t->part_started ? "]" : "[]", t->part);
        fclose(t->part);
    }
    if (t->main_started)
        fputc(']', t->main);
    fclose(t->main);
    pthread_mutex_destroy(&t->mu);
    oi_recq_free(t->queue);
    free(t);
}
