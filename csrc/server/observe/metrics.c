#include "server/observe/metrics.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/thread.h"
#include "server/observe/nvml.h"
#include "server/observe/statistics.h"

/* tritonserver's default --metrics-interval-ms. */
#define DEFAULT_INTERVAL_MS 2000

typedef struct cpu_sample_s {
    unsigned long long busy, idle;
    int ok;
} cpu_sample_t;

/* What the poller read last: the gauges a scrape shows. */
typedef struct polled_s {
    double cpu_util, mem_total, mem_used;
    oi_gpu_sample_t *gpus; /* nvml count entries */
} polled_t;

struct oi_metrics_s {
    oi_metrics_config_t cfg;
    oi_nvml_t *nvml; /* NULL: no GPU metrics; the poller's */
    int ngpu;
    cpu_sample_t last; /* the poller's previous /proc/stat reading */
    /* The poller thread reads the machine every interval_ms / 2, as Triton's metrics thread
     * does, and publishes under `mu`; a scrape copies what it finds. */
    pthread_mutex_t mu;
    pthread_cond_t wake;
    int stop;        /* under mu */
    polled_t polled; /* under mu */
    int polling;     /* the thread runs */
    pthread_t poller;
    char *custom; /* under mu: the models' own families (oi_metrics_set_custom); NULL: none */
    size_t custom_len;
};

/* ---- the machine ---------------------------------------------------------------------------- */

/* The aggregate "cpu" line of /proc/stat, split into busy (user, nice, system, irq, softirq,
 * steal) and idle (idle, iowait) jiffies, as Triton counts them. */
static cpu_sample_t read_cpu(void)
{
    cpu_sample_t s = {0, 0, 0};
    FILE *f = fopen("/proc/stat", "re");
    if (f == NULL)
        return s;
    unsigned long long user, nice, system, idle, iowait, irq, softirq, steal;
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &system, &idle, &iowait, &irq,
               &softirq, &steal) == 8) {
        s.busy = user + nice + system + irq + softirq + steal;
        s.idle = idle + iowait;
        s.ok = 1;
    }
    fclose(f);
    return s;
}

/* MemTotal and MemTotal - MemAvailable of /proc/meminfo, in bytes; 0 when unreadable. */
static int read_memory(double *total, double *used)
{
    FILE *f = fopen("/proc/meminfo", "re");
    if (f == NULL)
        return -1;
    char line[256];
    unsigned long long kb, tot = 0, avail = 0;
    int have = 0;
    while (fgets(line, sizeof(line), f) != NULL && have != 3) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) {
            tot = kb;
            have |= 1;
        } else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            avail = kb;
            have |= 2;
        }
    }
    fclose(f);
    if (have != 3 || avail > tot)
        return -1;
    *total = (double)tot * 1024;
    *used = (double)(tot - avail) * 1024;
    return 0;
}

/* One reading of the machine into mx->polled. The poller's (or oi_metrics_new's, before it
 * starts). */
static void poll_once(oi_metrics_t *mx, oi_gpu_sample_t *scratch)
{
    double util = 0, total = 0, used = 0;
    if (mx->cfg.cpu) {
        cpu_sample_t now = read_cpu();
        if (now.ok && mx->last.ok) {
            unsigned long long busy = now.busy > mx->last.busy ? now.busy - mx->last.busy : 0;
            unsigned long long idle = now.idle > mx->last.idle ? now.idle - mx->last.idle : 0;
            util = busy + idle ? (double)busy / (double)(busy + idle) : 0;
        }
        if (now.ok)
            mx->last = now;
        read_memory(&total, &used);
    }
    for (int i = 0; i < mx->ngpu; i++)
        oi_nvml_read(mx->nvml, i, &scratch[i]);
    pthread_mutex_lock(&mx->mu);
    mx->polled.cpu_util = util;
    mx->polled.mem_total = total;
    mx->polled.mem_used = used;
    if (mx->ngpu)
        memcpy(mx->polled.gpus, scratch, (size_t)mx->ngpu * sizeof(*scratch));
    pthread_mutex_unlock(&mx->mu);
}

static void *poller_main(void *arg)
{
    oi_metrics_t *mx = arg;
    oi_gpu_sample_t *scratch = mx->ngpu ? calloc((size_t)mx->ngpu, sizeof(*scratch)) : NULL;
    unsigned half = mx->cfg.interval_ms / 2 ? mx->cfg.interval_ms / 2 : 1;
    pthread_mutex_lock(&mx->mu);
    while (!mx->stop && !(mx->ngpu && scratch == NULL)) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += half / 1000;
        until.tv_nsec += (long)(half % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        int rc = 0;
        while (!mx->stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&mx->wake, &mx->mu, &until);
        if (mx->stop)
            break;
        pthread_mutex_unlock(&mx->mu);
        poll_once(mx, scratch);
        pthread_mutex_lock(&mx->mu);
    }
    pthread_mutex_unlock(&mx->mu);
    free(scratch);
    return NULL;
}

oi_metrics_t *oi_metrics_new(const oi_metrics_config_t *cfg)
{
    oi_metrics_t *mx = calloc(1, sizeof(*mx));
    if (mx == NULL)
        return NULL;
    mx->cfg = *cfg;
    if (mx->cfg.interval_ms == 0)
        mx->cfg.interval_ms = DEFAULT_INTERVAL_MS;
    if (cfg->gpu)
        mx->nvml = oi_nvml_open();
    mx->ngpu = oi_nvml_count(mx->nvml);
    mx->polled.gpus = mx->ngpu ? calloc((size_t)mx->ngpu, sizeof(oi_gpu_sample_t)) : NULL;
    oi_gpu_sample_t *scratch = mx->ngpu ? calloc((size_t)mx->ngpu, sizeof(oi_gpu_sample_t)) : NULL;
    if (mx->ngpu && (mx->polled.gpus == NULL || scratch == NULL)) {
        free(scratch);
        oi_nvml_close(mx->nvml);
        free(mx->polled.gpus);
        free(mx);
        return NULL;
    }
    pthread_mutex_init(&mx->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&mx->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (cfg->cpu)
        mx->last = read_cpu();
    poll_once(mx, scratch); /* the gauges have values from the start */
    free(scratch);
    /* Nothing to poll, no thread; a thread that cannot start leaves the first reading. */
    if (cfg->cpu || mx->ngpu)
        mx->polling = oi_thread_create(&mx->poller, "oi-metrics-poll", poller_main, mx, 0) == 0;
    return mx;
}

void oi_metrics_free(oi_metrics_t *mx)
{
    if (mx == NULL)
        return;
    if (mx->polling) {
        pthread_mutex_lock(&mx->mu);
        mx->stop = 1;
        pthread_cond_signal(&mx->wake);
        pthread_mutex_unlock(&mx->mu);
        pthread_join(mx->poller, NULL);
    }
    pthread_cond_destroy(&mx->wake);
    pthread_mutex_destroy(&mx->mu);
    oi_nvml_close(mx->nvml);
    free(mx->polled.gpus);
    free(mx->custom);
    free(mx);
}

int oi_metrics_gpus(const oi_metrics_t *mx)
{
    return mx->ngpu;
}

/* ---- text ------------------------------------------------------------------------------------ */

/* A sample value as prometheus-cpp (Triton's serializer) writes it: %.16g. */
static int value(oi_sbuf_t *o, double v) { return oi_sbuf_printf(o, " %.16g\n", v); }

static int family(oi_sbuf_t *o, const char *name, const char *help, const char *type)
{
    return oi_sbuf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value with \, " and newline escaped. */
static int label_value(oi_sbuf_t *o, const char *s)
{
    int rc = 0;
    for (const char *p = s; *p && rc == 0; p++) {
        if (*p == '\\' || *p == '"')
            rc = oi_sbuf_printf(o, "\\%c", *p);
        else if (*p == '\n')
            rc = oi_sbuf_append(o, "\\n", 2);
        else
            rc = oi_sbuf_append(o, p, 1);
    }
    return rc;
}

/* The model's labels up to its version's: model="m"[,namespace="repo"] (with
 * --model-namespacing Triton labels each model with its namespace). */
static int model_labels(oi_sbuf_t *o, const char *name, const oi_model_t *m)
{
    int rc = oi_sbuf_printf(o, "%s{model=\"", name) | label_value(o, m->name);
    if (m->ns != NULL)
        rc |= oi_sbuf_append(o, "\",namespace=\"", 13) | label_value(o, m->ns);
    return rc;
}

/* name{model="m",[namespace="n",][extra="v",]version="1"[,le="x"]} — labels in name order, as Triton's. */
static int model_series(oi_sbuf_t *o, const char *name, const oi_model_t *m, const char *reason, const char *le)
{
    int rc = model_labels(o, name, m);
    if (reason != NULL)
        rc |= oi_sbuf_printf(o, "\",reason=\"%s", reason);
    rc |= oi_sbuf_printf(o, "\",version=\"%s\"", m->version_str);
    if (le != NULL)
        rc |= oi_sbuf_printf(o, ",le=\"%s\"", le);
    rc |= oi_sbuf_append(o, "}", 1);
    return rc;
}

typedef double (*getter_t)(const oi_model_stats_t *);

static double g_success(const oi_model_stats_t *s) { return (double)s->snap.success.count; }
static double g_count(const oi_model_stats_t *s) { return (double)s->snap.inference_count; }
static double g_exec(const oi_model_stats_t *s) { return (double)s->snap.execution_count; }
static double g_request_us(const oi_model_stats_t *s) { return (double)(s->snap.success.ns / 1000); }
static double g_queue_us(const oi_model_stats_t *s) { return (double)(s->snap.queue.ns / 1000); }
static double g_input_us(const oi_model_stats_t *s) { return (double)(s->snap.compute_input.ns / 1000); }
static double g_infer_us(const oi_model_stats_t *s) { return (double)(s->snap.compute_infer.ns / 1000); }
static double g_output_us(const oi_model_stats_t *s) { return (double)(s->snap.compute_output.ns / 1000); }
static double g_pending(const oi_model_stats_t *s) { return (double)s->pending; }
static double g_load_secs(const oi_model_stats_t *s)
{
    return (double)s->model->load_ns / 1e9;
}

static const struct {
    const char *name, *help;
    getter_t get;
} counters[] = {
    {"nv_inference_request_success", "Number of successful inference requests, all batch sizes", g_success},
    {"nv_inference_request_failure", "Number of failed inference requests, all batch sizes", NULL},
    {"nv_inference_count", "Number of inferences performed (does not include cached requests)", g_count},
    {"nv_inference_exec_count", "Number of model executions performed (does not include cached requests)", g_exec},
},
  latencies[] = {
      {"nv_inference_request_duration_us",
       "Cumulative inference request duration in microseconds (includes cached requests)", g_request_us},
      {"nv_inference_queue_duration_us",
       "Cumulative inference queuing duration in microseconds (includes cached requests)", g_queue_us},
      {"nv_inference_compute_input_duration_us",
       "Cumulative compute input duration in microseconds (does not include cached requests)", g_input_us},
      {"nv_inference_compute_infer_duration_us",
       "Cumulative compute inference duration in microseconds (does not include cached requests)", g_infer_us},
      {"nv_inference_compute_output_duration_us",
       "Cumulative inference compute output duration in microseconds (does not include cached requests)", g_output_us},
};

static double g_cache_hits(const oi_model_stats_t *s) { return (double)s->cache_hit.count; }
static double g_cache_hit_us(const oi_model_stats_t *s) { return (double)(s->cache_hit.ns / 1000); }
static double g_cache_misses(const oi_model_stats_t *s) { return (double)s->cache_miss.count; }
static double g_cache_miss_us(const oi_model_stats_t *s) { return (double)(s->cache_miss.ns / 1000); }

/* Triton's per-model response cache counters, for the models that use the cache only. */
static const struct {
    const char *name, *help;
    getter_t get;
} cache_counters[] = {
    {"nv_cache_num_hits_per_model", "Number of cache hits per model", g_cache_hits},
    {"nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds", g_cache_hit_us},
    {"nv_cache_num_misses_per_model", "Number of cache misses per model", g_cache_misses},
    {"nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     g_cache_miss_us},
};

static int cache_families(oi_sbuf_t *o, const oi_model_stats_t *items, size_t n)
{
    int rc = 0, any = 0;
    for (size_t i = 0; i < n; i++)
        any |= items[i].model->cache != NULL;
    for (size_t f = 0; any && f < sizeof(cache_counters) / sizeof(cache_counters[0]); f++) {
        rc |= family(o, cache_counters[f].name, cache_counters[f].help, "counter");
        for (size_t i = 0; i < n; i++) {
            if (items[i].model->cache == NULL)
                continue;
            rc |= model_series(o, cache_counters[f].name, items[i].model, NULL, NULL);
            rc |= value(o, cache_counters[f].get(&items[i]));
        }
    }
    return rc;
}

static int model_family(oi_sbuf_t *o, const char *name, const char *help, const char *type, getter_t get,
                        const oi_model_stats_t *items, size_t n)
{
    int rc = family(o, name, help, type);
    for (size_t i = 0; i < n; i++) {
        if (get != NULL) {
            rc |= model_series(o, name, items[i].model, NULL, NULL);
            rc |= value(o, get(&items[i]));
            continue;
        }
        for (int r = 0; r < OI_FAIL_REASONS; r++) { /* the failure counter, one series per reason */
            rc |= model_series(o, name, items[i].model, oi_fail_reason_name((oi_fail_reason_t)r), NULL);
            rc |= value(o, (double)items[i].snap.fail_by_reason[r]);
        }
    }
    return rc;
}

static int histograms(oi_sbuf_t *o, const oi_model_stats_t *items, size_t n)
{
    static const char name[] = "nv_inference_first_response_histogram_ms";
    int rc = family(o, name, "Duration from request to first response in milliseconds", "histogram");
    char key[sizeof(name) + 16];
    for (size_t i = 0; i < n; i++) {
        const oi_stats_snapshot_t *s = &items[i].snap;
        uint64_t total = 0;
        for (int b = 0; b <= OI_HIST_BUCKETS; b++)
            total += s->hist[b];
        snprintf(key, sizeof(key), "%s_count", name);
        rc |= model_series(o, key, items[i].model, NULL, NULL) | value(o, (double)total);
        snprintf(key, sizeof(key), "%s_sum", name);
        rc |= model_series(o, key, items[i].model, NULL, NULL) | value(o, (double)s->hist_sum_ms);
        snprintf(key, sizeof(key), "%s_bucket", name);
        uint64_t cumulative = 0;
        for (int b = 0; b <= OI_HIST_BUCKETS; b++) {
            char le[32];
            if (b < OI_HIST_BUCKETS)
                snprintf(le, sizeof(le), "%.16g", (double)oi_hist_bounds_ms[b]);
            else
                snprintf(le, sizeof(le), "+Inf");
            cumulative += s->hist[b];
            rc |= model_series(o, key, items[i].model, NULL, le) | value(o, (double)cumulative);
        }
    }
    return rc;
}

static const struct {
    const char *name, *help;
} summaries[OI_SUM_KINDS] = {
    {"nv_inference_request_summary_us", "Summary of inference request duration in microseconds (includes cached "
                                        "requests)"},
    {"nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds (includes cached "
                                      "requests)"},
    {"nv_inference_compute_input_summary_us", "Cumulative compute input duration in microseconds (does not include "
                                              "cached requests)"},
    {"nv_inference_compute_infer_summary_us", "Cumulative compute inference duration in microseconds (does not "
                                              "include cached requests)"},
    {"nv_inference_compute_output_summary_us", "Cumulative inference compute output duration in microseconds (does "
                                               "not include cached requests)"},
    {"nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds."},
    {"nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds."},
};

/* Whether model `m` has a series in summary family `k`: as tritonserver, a model with a response
 * cache has no request summary (its durations would mix cached answers in), and only such a
 * model has the cache summaries. */
static int has_summary(const oi_model_t *m, int k)
{
    if (k >= OI_SUM_REQUEST_KINDS)
        return m->cache != NULL && oi_scheduler_stats(m->sched)->cache_summary != NULL;
    return k != OI_SUM_REQUEST || m->cache == NULL;
}

/* The count and total (us) of model i's observations of kind k. */
static void summary_totals(const oi_model_stats_t *item, int k, double *count, double *sum_us)
{
    const oi_model_t *m = item->model;
    if (k == OI_SUM_CACHE_HIT || k == OI_SUM_CACHE_MISS) {
        int hit = k == OI_SUM_CACHE_HIT;
        *count = (double)atomic_load(hit ? &m->cache_hits : &m->cache_misses);
        *sum_us = (double)(atomic_load(hit ? &m->cache_hit_ns : &m->cache_miss_ns) / 1000);
        return;
    }
    const oi_stats_snapshot_t *snap = &item->snap;
    const oi_stat_duration_t *d[OI_SUM_REQUEST_KINDS] = {&snap->success, &snap->queue, &snap->compute_input,
                                                         &snap->compute_infer, &snap->compute_output};
    *count = (double)d[k]->count;
    *sum_us = (double)(d[k]->ns / 1000);
}

/* A summary as prometheus-cpp writes one: _count and _sum (all time), then one series per
 * quantile of the last minute, labelled quantile; "Nan" (prometheus-cpp's spelling) when the
 * minute saw no request. A family left without series is left out. */
static int summary_families(oi_sbuf_t *o, const oi_metrics_config_t *cfg, const oi_model_stats_t *items, size_t n)
{
    static const double defaults[] = {0.5, 0.9, 0.95, 0.99, 0.999};
    const double *qs = cfg->n_quantiles ? cfg->quantiles : defaults;
    int nq = cfg->n_quantiles ? cfg->n_quantiles : (int)(sizeof(defaults) / sizeof(defaults[0]));
    uint64_t *counts = malloc(OI_SUMMARY_BUCKETS * sizeof(uint64_t));
    if (counts == NULL)
        return -1;
    uint64_t now = oi_now_ns();
    int rc = 0;
    for (int k = 0; k < OI_SUM_KINDS; k++) {
        char key[64];
        size_t shown = 0;
        for (size_t i = 0; i < n; i++)
            shown += has_summary(items[i].model, k);
        if (shown > 0)
            rc |= family(o, summaries[k].name, summaries[k].help, "summary");
        for (size_t i = 0; i < n; i++) {
            if (!has_summary(items[i].model, k))
                continue;
            double count, sum_us;
            summary_totals(&items[i], k, &count, &sum_us);
            snprintf(key, sizeof(key), "%s_count", summaries[k].name);
            rc |= model_series(o, key, items[i].model, NULL, NULL) | value(o, count);
            snprintf(key, sizeof(key), "%s_sum", summaries[k].name);
            rc |= model_series(o, key, items[i].model, NULL, NULL) | value(o, sum_us);
            memset(counts, 0, OI_SUMMARY_BUCKETS * sizeof(uint64_t));
            const oi_stats_t *st = oi_scheduler_stats(items[i].model->sched);
            if (k >= OI_SUM_REQUEST_KINDS)
                oi_summary_merge(st->cache_summary, (oi_summary_kind_t)k, now, counts);
            for (int sl = 0; k < OI_SUM_REQUEST_KINDS && sl < st->nslots; sl++)
                if (st->slots[sl].summary != NULL)
                    oi_summary_merge(st->slots[sl].summary, (oi_summary_kind_t)k, now, counts);
            for (int q = 0; q < nq; q++) {
                char label[40];
                snprintf(label, sizeof(label), "%.16g", qs[q]);
                rc |= model_labels(o, summaries[k].name, items[i].model);
                rc |= oi_sbuf_printf(o, "\",version=\"%s\",quantile=\"%s\"}", items[i].model->version_str, label);
                double v = oi_summary_quantile(counts, qs[q]);
                rc |= isnan(v) ? oi_sbuf_append(o, " Nan\n", 5) : value(o, v);
            }
        }
    }
    free(counts);
    return rc;
}

/* The GPU families: one series per GPU that NVML read, labelled gpu_uuid. */
static int gpu_family(oi_sbuf_t *o, const char *name, const char *help, const char *type, const oi_gpu_sample_t *g,
                      int n, size_t offset)
{
    int any = 0;
    for (int i = 0; i < n; i++)
        any |= *(const double *)((const char *)&g[i] + offset) >= 0;
    if (!any)
        return 0;
    int rc = family(o, name, help, type);
    for (int i = 0; i < n; i++) {
        double v = *(const double *)((const char *)&g[i] + offset);
        if (v < 0)
            continue;
        rc |= oi_sbuf_printf(o, "%s{gpu_uuid=\"", name) | label_value(o, g[i].uuid) | oi_sbuf_append(o, "\"}", 2);
        rc |= value(o, v);
    }
    return rc;
}

int oi_metrics_render(oi_metrics_t *mx, oi_registry_t *r, int per_model, oi_sbuf_t *o)
{
    oi_model_stats_t *items = NULL;
    size_t n = 0;
    if (per_model) {
        oi_status_t *st = oi_statistics_collect(r, NULL, NULL, &items, &n);
        if (st != NULL) {
            oi_status_free(st);
            return -1;
        }
    }
    int ngpu = mx->ngpu;
    oi_gpu_sample_t *gpus = ngpu ? calloc((size_t)ngpu, sizeof(*gpus)) : NULL;
    if (ngpu && gpus == NULL) {
        oi_statistics_release(items, n);
        return -1;
    }
    pthread_mutex_lock(&mx->mu);
    polled_t now = mx->polled;
    if (ngpu)
        memcpy(gpus, mx->polled.gpus, (size_t)ngpu * sizeof(*gpus));
    pthread_mutex_unlock(&mx->mu);
    int rc = 0;
    /* prometheus-cpp writes counters, then gauges, then histograms, each in the order Triton
     * registers them; families without a series are left out. */
    for (size_t f = 0; n && f < sizeof(counters) / sizeof(counters[0]); f++)
        rc |= model_family(o, counters[f].name, counters[f].help, "counter", counters[f].get, items, n);
    for (size_t f = 0; n && mx->cfg.counter_latencies && f < sizeof(latencies) / sizeof(latencies[0]); f++)
        rc |= model_family(o, latencies[f].name, latencies[f].help, "counter", latencies[f].get, items, n);
    rc |= cache_families(o, items, n);
#define GPU(name, help, type, field) rc |= gpu_family(o, name, help, type, gpus, ngpu, offsetof(oi_gpu_sample_t, field))
    GPU("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", "counter",
        energy_joules);
    if (n)
        rc |= model_family(o, "nv_inference_pending_request_count",
                           "Instantaneous number of pending requests awaiting execution per-model.", "gauge", g_pending,
                           items, n);
    if (n)
        rc |= model_family(o, "nv_model_load_duration_secs", "Model load time in seconds", "gauge", g_load_secs, items,
                           n);
    /* openinfer keeps no pinned memory pool: 0 bytes, as tritonserver reports with
     * --pinned-memory-pool-byte-size 0. */
    rc |= family(o, "nv_pinned_memory_pool_total_bytes", "Pinned memory pool total memory size, in bytes", "gauge");
    rc |= oi_sbuf_append(o, "nv_pinned_memory_pool_total_bytes", 33) | value(o, 0);
    rc |= family(o, "nv_pinned_memory_pool_used_bytes", "Pinned memory pool used memory size, in bytes", "gauge");
    rc |= oi_sbuf_append(o, "nv_pinned_memory_pool_used_bytes", 32) | value(o, 0);
    GPU("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge", utilization);
    GPU("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge", memory_total);
    GPU("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge", memory_used);
    GPU("nv_gpu_power_usage", "GPU power usage in watts", "gauge", power_usage);
    GPU("nv_gpu_power_limit", "GPU power management limit in watts", "gauge", power_limit);
#undef GPU
    if (mx->cfg.cpu) {
        rc |= family(o, "nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge");
        rc |= oi_sbuf_append(o, "nv_cpu_utilization", 18) | value(o, now.cpu_util);
        rc |= family(o, "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "gauge");
        rc |= oi_sbuf_append(o, "nv_cpu_memory_total_bytes", 25) | value(o, now.mem_total);
        rc |= family(o, "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "gauge");
        rc |= oi_sbuf_append(o, "nv_cpu_memory_used_bytes", 24) | value(o, now.mem_used);
    }
    if (n && mx->cfg.histogram_latencies)
        rc |= histograms(o, items, n);
    if (n && mx->cfg.summary_latencies)
        rc |= summary_families(o, &mx->cfg, items, n);
    pthread_mutex_lock(&mx->mu);
    if (mx->custom_len)
        rc |= oi_sbuf_append(o, mx->custom, mx->custom_len);
    pthread_mutex_unlock(&mx->mu);
    free(gpus);
    oi_statistics_release(items, n);
    return rc ? -1 : 0;
}

int oi_metrics_set_custom(oi_metrics_t *mx, const char *text, size_t len)
{
    char *copy = len ? malloc(len) : NULL;
    if (len && copy == NULL)
        return -1;
    if (len)
        memcpy(copy, text, len);
    pthread_mutex_lock(&mx->mu);
    char *old = mx->custom;
    mx->custom = copy;
    mx->custom_len = len;
    pthread_mutex_unlock(&mx->mu);
    free(old);
    return 0;
}
