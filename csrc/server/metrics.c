#include "server/metrics.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/nvml.h"
#include "server/statistics.h"

typedef struct cpu_sample_s {
    unsigned long long busy, idle;
    int ok;
} cpu_sample_t;

struct oi_metrics_s {
    oi_metrics_config_t cfg;
    oi_nvml_t *nvml;   /* NULL: no GPU metrics */
    cpu_sample_t last; /* the previous /proc/stat reading */
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

oi_metrics_t *oi_metrics_new(const oi_metrics_config_t *cfg)
{
    oi_metrics_t *mx = calloc(1, sizeof(*mx));
    if (mx == NULL)
        return NULL;
    mx->cfg = *cfg;
    if (cfg->gpu)
        mx->nvml = oi_nvml_open();
    if (cfg->cpu)
        mx->last = read_cpu();
    return mx;
}

void oi_metrics_free(oi_metrics_t *mx)
{
    if (mx == NULL)
        return;
    oi_nvml_close(mx->nvml);
    free(mx);
}

int oi_metrics_gpus(const oi_metrics_t *mx) { return oi_nvml_count(mx->nvml); }

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

/* name{model="m",[extra="v",]version="1"[,le="x"]} — labels in name order, as Triton's. */
static int model_series(oi_sbuf_t *o, const char *name, const oi_model_t *m, const char *reason, const char *le)
{
    int rc = oi_sbuf_printf(o, "%s{model=\"", name);
    rc |= label_value(o, m->name);
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
    int ngpu = oi_nvml_count(mx->nvml);
    oi_gpu_sample_t *gpus = ngpu ? calloc((size_t)ngpu, sizeof(*gpus)) : NULL;
    if (ngpu && gpus == NULL) {
        oi_statistics_release(items, n);
        return -1;
    }
    for (int i = 0; i < ngpu; i++)
        oi_nvml_read(mx->nvml, i, &gpus[i]);
    int rc = 0;
    /* prometheus-cpp writes counters, then gauges, then histograms, each in the order Triton
     * registers them; families without a series are left out. */
    for (size_t f = 0; n && f < sizeof(counters) / sizeof(counters[0]); f++)
        rc |= model_family(o, counters[f].name, counters[f].help, "counter", counters[f].get, items, n);
    for (size_t f = 0; n && mx->cfg.counter_latencies && f < sizeof(latencies) / sizeof(latencies[0]); f++)
        rc |= model_family(o, latencies[f].name, latencies[f].help, "counter", latencies[f].get, items, n);
#define GPU(name, help, type, field) rc |= gpu_family(o, name, help, type, gpus, ngpu, offsetof(oi_gpu_sample_t, field))
    GPU("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", "counter",
        energy_joules);
    if (n)
        rc |= model_family(o, "nv_inference_pending_request_count",
                           "Instantaneous number of pending requests awaiting execution per-model.", "gauge", g_pending,
                           items, n);
    GPU("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge", utilization);
    GPU("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge", memory_total);
    GPU("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge", memory_used);
    GPU("nv_gpu_power_usage", "GPU power usage in watts", "gauge", power_usage);
    GPU("nv_gpu_power_limit", "GPU power management limit in watts", "gauge", power_limit);
#undef GPU
    if (mx->cfg.cpu) {
        cpu_sample_t now = read_cpu();
        double util = 0, total = 0, used = 0;
        if (now.ok && mx->last.ok) {
            unsigned long long busy = now.busy > mx->last.busy ? now.busy - mx->last.busy : 0;
            unsigned long long idle = now.idle > mx->last.idle ? now.idle - mx->last.idle : 0;
            util = busy + idle ? (double)busy / (double)(busy + idle) : 0;
        }
        if (now.ok)
            mx->last = now;
        read_memory(&total, &used);
        rc |= family(o, "nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge");
        rc |= oi_sbuf_append(o, "nv_cpu_utilization", 18) | value(o, util);
        rc |= family(o, "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "gauge");
        rc |= oi_sbuf_append(o, "nv_cpu_memory_total_bytes", 25) | value(o, total);
        rc |= family(o, "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "gauge");
        rc |= oi_sbuf_append(o, "nv_cpu_memory_used_bytes", 24) | value(o, used);
    }
    if (n && mx->cfg.histogram_latencies)
        rc |= histograms(o, items, n);
    free(gpus);
    oi_statistics_release(items, n);
    return rc ? -1 : 0;
}
