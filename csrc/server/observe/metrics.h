/* Prometheus metrics in the text exposition format (version 0.0.4) with Triton's metric
 * names, help texts and labels, so that existing Triton dashboards and alerts work: per model
 * version counters read from the inference statistics (server/observe/counters.h), the pending request
 * gauge, an optional first-response latency histogram, the machine's CPU utilisation and
 * memory, and GPU utilisation, memory and power through NVML where there is one. The text is
 * made only when scraped; nothing here runs on the inference path. */
#ifndef OI_SERVER_OBSERVE_METRICS_H
#define OI_SERVER_OBSERVE_METRICS_H

#include "core/buf.h"
#include "server/models/registry.h"

/* What /metrics shows (tritonserver's --allow-cpu-metrics, --allow-gpu-metrics and
 * --metrics-config settings). */
typedef struct oi_metrics_config_s {
    int counter_latencies;   /* the cumulative *_duration_us counters; Triton's default: on */
    int histogram_latencies; /* nv_inference_first_response_histogram_ms; default off */
    int cpu;                 /* nv_cpu_utilization and nv_cpu_memory_*_bytes */
    int gpu;                 /* nv_gpu_* and nv_energy_consumption, when NVML finds a GPU */
    /* --metrics-interval-ms: CPU and GPU readings are taken by a thread of their own every
     * half of it, as Triton's polling thread takes them; a scrape shows the latest. 0: 2000. */
    unsigned interval_ms;
    /* nv_inference_*_summary_us (summary_latencies=true) with these quantiles
     * (summary_quantiles; Triton's default 0.5, 0.9, 0.95, 0.99, 0.999). The models' statistics
     * must have summaries (oi_stats_enable_summaries). */
    int summary_latencies;
    int n_quantiles;
    double quantiles[16];
} oi_metrics_config_t;

typedef struct oi_metrics_s oi_metrics_t;

/* Returns the metrics state (loads NVML when cfg->gpu; takes the first readings and starts
 * the polling thread), or NULL when out of memory. */
oi_metrics_t *oi_metrics_new(const oi_metrics_config_t *cfg);

void oi_metrics_free(oi_metrics_t *mx);

/* Whether NVML found a GPU to report. */
int oi_metrics_gpus(const oi_metrics_t *mx);

/* Replaces the models' own metric families (a Triton Python model's pb_utils.MetricFamily,
 * rendered by the Python side whenever one changes) with `len` bytes of exposition text, which
 * every scrape appends after the server's own families. Any thread. 0, or -1 when out of memory
 * (the previous text stays). */
int oi_metrics_set_custom(oi_metrics_t *mx, const char *text, size_t len);

/* Appends the exposition text to `out`: per-model families for every ready version in `r`
 * when `per_model` (statistics are counted), then the pinned memory pool (none: 0 bytes), GPU
 * and CPU as last polled (CPU utilisation: the share of busy time between the last two
 * readings). One thread at a time. 0, or -1 when out of memory. */
int oi_metrics_render(oi_metrics_t *mx, oi_registry_t *r, int per_model, oi_sbuf_t *out);

#endif
