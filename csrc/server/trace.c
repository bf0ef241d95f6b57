#include "server/trace.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/recq.h"
#include "core/thread.h"

/* Queued records: a power of two; at ~240 bytes each, 4096 is about 1 MiB. */
#define CAPACITY 4096
/* How long the writer sleeps when the queue is empty. */
#define IDLE_NS 5000000L
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
    atomic_int stop;
    oi_recq_t *queue;
    /* The writer's. */
    char path[4096];
    FILE *main;       /* path (log_frequency 0) */
    int main_started; /* "[" written to main */
    FILE *part;       /* path.<index> (log_frequency > 0) */
    unsigned index, in_part;
    pthread_t writer;
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

uint64_t oi_tracer_sample(oi_tracer_t *t, const char *model)
{
    if (t == NULL)
        return 0;
    setting_t *s = setting_for(t, model);
    if (!atomic_load_explicit(&s->level, memory_order_relaxed))
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
    return atomic_fetch_add_explicit(&t->next_id, 1, memory_order_relaxed) + 1;
}

void oi_tracer_push(oi_tracer_t *t, const oi_trace_rec_t *rec)
{
    oi_recq_push(t->queue, rec);
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

/* Triton's layout: the request's details, then one object per timestamp. */
static void write_rec(FILE *f, const oi_trace_rec_t *r)
{
    fprintf(f, "{\"id\":%" PRIu64 ",\"model_name\":\"", r->id);
    put_json_text(f, r->model_name);
    fprintf(f, "\",\"model_version\":%" PRId64 "}", r->model_version);
    for (int i = 0; i < OI_TS_COUNT; i++)
        if (r->ns[i] != 0)
            fprintf(f, ",{\"id\":%" PRIu64 ",\"timestamps\":[{\"name\":\"%s\",\"ns\":%" PRIu64 "}]}", r->id,
                    point_name(r, i), r->ns[i]);
}

/* Appends a record to the file the log frequency picks: the one file, or the current index
 * file, which is closed (a whole JSON array) once it holds log_frequency traces. */
static void save(oi_tracer_t *t, const oi_trace_rec_t *r)
{
    unsigned freq = atomic_load(&t->log_frequency);
    FILE *f = t->main;
    if (freq == 0) {
        fputc(t->main_started ? ',' : '[', f);
        t->main_started = 1;
    } else {
        if (t->part == NULL) {
            char name[sizeof(t->path) + 16];
            snprintf(name, sizeof(name), "%s.%u", t->path, t->index);
            t->part = fopen(name, "we");
            if (t->part == NULL)
                return; /* the index file cannot be written: the trace is lost */
            t->in_part = 0;
        }
        f = t->part;
        fputc(t->in_part == 0 ? '[' : ',', f);
    }
    write_rec(f, r);
    if (freq != 0 && ++t->in_part >= freq) {
        fputc(']', t->part);
        fclose(t->part);
        t->part = NULL;
        t->index++;
    }
}

static void *writer_main(void *arg)
{
    oi_tracer_t *t = arg;
    oi_trace_rec_t rec;
    for (;;) {
        int stopping = atomic_load(&t->stop);
        size_t n = 0;
        for (; oi_recq_pop(t->queue, &rec); n++)
            save(t, &rec);
        if (atomic_exchange(&t->flush, 0)) {
            fflush(t->main);
            if (t->part != NULL)
                fflush(t->part);
        }
        if (stopping)
            break;
        if (n == 0) {
            struct timespec idle = {0, IDLE_NS};
            nanosleep(&idle, NULL);
        }
    }
    return NULL;
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
    int rc = oi_thread_create(&t->writer, writer_main, t, 0);
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
    atomic_store(&t->stop, 1);
    pthread_join(t->writer, NULL);
    if (t->part != NULL) {
        fputc(']', t->part);
        fclose(t->part);
    }
    if (t->main_started)
        fputc(']', t->main);
    fclose(t->main);
    pthread_mutex_destroy(&t->mu);
    oi_recq_free(t->queue);
    free(t);
}
