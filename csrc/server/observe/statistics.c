#include "server/observe/statistics.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"

typedef struct collect_s {
    oi_model_stats_t *items;
    size_t n, cap;
} collect_t;

/* Under the registry's read lock: the scheduler is alive while this reads it. */
static int take(void *ctx, oi_model_t *m)
{
    collect_t *c = ctx;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 8;
        oi_model_stats_t *grown = realloc(c->items, cap * sizeof(*grown));
        if (grown == NULL)
            return -1;
        c->items = grown;
        c->cap = cap;
    }
    oi_model_stats_t *it = &c->items[c->n];
    if (oi_stats_read(oi_scheduler_stats(m->sched), &it->snap) != 0)
        return -1;
    it->pending = oi_scheduler_pending(m->sched);
    it->cache_hit = (oi_stat_duration_t){atomic_load_explicit(&m->cache_hits, memory_order_relaxed),
                                         atomic_load_explicit(&m->cache_hit_ns, memory_order_relaxed)};
    it->cache_miss = (oi_stat_duration_t){atomic_load_explicit(&m->cache_misses, memory_order_relaxed),
                                          atomic_load_explicit(&m->cache_miss_ns, memory_order_relaxed)};
    /* Cache hits are successes that never reached the model. */
    it->snap.success.count += it->cache_hit.count;
    it->snap.success.ns += it->cache_hit.ns;
    oi_model_ref(m);
    it->model = m;
    c->n++;
    return 0;
}

static int by_name_version(const void *a, const void *b)
{
    const oi_model_t *x = ((const oi_model_stats_t *)a)->model, *y = ((const oi_model_stats_t *)b)->model;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->version > y->version) - (x->version < y->version);
}

/* A version as Triton reads it: digits, at most 18 (no sign, no blanks). */
static int parse_version(const char *s, int64_t *out)
{
    size_t n = strlen(s);
    if (n == 0 || n > 18 || strspn(s, "0123456789") != n)
        return -1;
    *out = (int64_t)strtoll(s, NULL, 10);
    return 0;
}

oi_status_t *oi_statistics_collect(oi_registry_t *r, const char *name, const char *version, oi_model_stats_t **out,
                                   size_t *n)
{
    *out = NULL;
    *n = 0;
    int all = name == NULL || name[0] == '\0';
    int64_t want = -1;
    if (!all && version != NULL && version[0] != '\0' && parse_version(version, &want) != 0)
        return oi_status_new(OI_BAD_REQUEST,
                             "failed to get model version from specified version string '%s' (details: stol), "
                             "version should be an integral value > 0", version);
    collect_t c = {0};
    if (oi_registry_visit_ready(r, all ? NULL : name, take, &c) != 0) {
        oi_statistics_release(c.items, c.n);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    /* A name that several namespaces hold is not available by name alone, as in Triton. */
    if (!all && (c.n == 0 || oi_registry_namespaces(r, name) > 1)) {
        oi_statistics_release(c.items, c.n);
        return oi_status_new(OI_BAD_REQUEST, "requested model '%s' is not available", name);
    }
    if (want >= 0) {
        size_t k = 0;
        for (size_t i = 0; i < c.n; i++) {
            if (c.items[i].model->version == want)
                c.items[k++] = c.items[i];
            else {
                oi_stats_snapshot_clear(&c.items[i].snap);
                oi_model_unref(c.items[i].model);
            }
        }
        c.n = k;
        if (k == 0) {
            free(c.items);
            return oi_status_new(OI_BAD_REQUEST, "requested model version is not available for model '%s'", name);
        }
    }
    if (c.n > 1)
        qsort(c.items, c.n, sizeof(*c.items), by_name_version);
    *out = c.items;
    *n = c.n;
    return NULL;
}

void oi_statistics_release(oi_model_stats_t *items, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        oi_stats_snapshot_clear(&items[i].snap);
        oi_model_unref(items[i].model);
    }
    free(items);
}

static int duration(oi_sbuf_t *o, const char *key, const oi_stat_duration_t *d, int comma)
{
    return oi_sbuf_printf(o, "%s\"%s\":{\"count\":%" PRIu64 ",\"ns\":%" PRIu64 "}", comma ? "," : "", key, d->count,
                          d->ns);
}

int oi_statistics_json(oi_sbuf_t *o, const oi_model_stats_t *items, size_t n)
{
    int rc = oi_sbuf_append(o, "{\"model_stats\":[", 16);
    for (size_t i = 0; i < n && rc == 0; i++) {
        const oi_model_t *m = items[i].model;
        const oi_stats_snapshot_t *s = &items[i].snap;
        rc |= oi_sbuf_append(o, i ? ",{\"name\":" : "{\"name\":", i ? 9 : 8);
        rc |= oi_json_write_string(o, m->name, strlen(m->name));
        rc |= oi_sbuf_printf(o,
                             ",\"version\":\"%s\",\"last_inference\":%" PRIu64 ",\"inference_count\":%" PRIu64
                             ",\"execution_count\":%" PRIu64 ",\"inference_stats\":{",
                             m->version_str, s->last_inference_ms, s->inference_count, s->execution_count);
        rc |= duration(o, "success", &s->success, 0);
        rc |= duration(o, "fail", &s->fail, 1);
        rc |= duration(o, "queue", &s->queue, 1);
        rc |= duration(o, "compute_input", &s->compute_input, 1);
        rc |= duration(o, "compute_infer", &s->compute_infer, 1);
        rc |= duration(o, "compute_output", &s->compute_output, 1);
        rc |= duration(o, "cache_hit", &items[i].cache_hit, 1);
        rc |= duration(o, "cache_miss", &items[i].cache_miss, 1);
        /* Per-response statistics come from decoupled models only: none here. */
        rc |= oi_sbuf_append(o, "},\"response_stats\":{},\"batch_stats\":[", 37);
        for (size_t b = 0; b < s->n_batches; b++) {
            const oi_batch_stats_t *bs = &s->batches[b];
            rc |= oi_sbuf_printf(o, "%s{\"batch_size\":%" PRIu64, b ? "," : "", bs->batch_size);
            rc |= duration(o, "compute_input", &bs->compute_input, 1);
            rc |= duration(o, "compute_infer", &bs->compute_infer, 1);
            rc |= duration(o, "compute_output", &bs->compute_output, 1);
            rc |= oi_sbuf_append(o, "}", 1);
        }
        rc |= oi_sbuf_append(o, "],\"memory_usage\":[]}", 20);
    }
    if (rc == 0)
        rc = oi_sbuf_append(o, "]}", 2);
    return rc ? -1 : 0;
}
