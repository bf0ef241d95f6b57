/* Latency summaries (tritonserver's --metrics-config summary_latencies=true): quantiles of
 * the request, queue and compute durations of the last minute, per model version. Each
 * executor's statistics slot owns one, written by that executor alone (no lock, no locked
 * instruction); the metrics endpoint merges them when scraped. Durations fall into
 * log-linear buckets (16 per power of two, exact below 32 us), so a quantile is within about
 * 3% of the observed value, where Triton's prometheus-cpp summaries bound the rank error
 * instead; the window is six 10-second parts (prometheus-cpp: 60 s in five parts). */
#ifndef OI_SERVER_OBSERVE_SUMMARY_H
#define OI_SERVER_OBSERVE_SUMMARY_H

#include <stdatomic.h>
#include <stdint.h>

/* What is observed, in Triton's family order: a request's durations (by its executor), then
 * the response cache's hits and misses (by any thread, in a summary of their own). */
typedef enum {
    OI_SUM_REQUEST,
    OI_SUM_QUEUE,
    OI_SUM_COMPUTE_INPUT,
    OI_SUM_COMPUTE_INFER,
    OI_SUM_COMPUTE_OUTPUT,
    OI_SUM_CACHE_HIT,
    OI_SUM_CACHE_MISS,
    OI_SUM_KINDS
} oi_summary_kind_t;

#define OI_SUM_REQUEST_KINDS OI_SUM_CACHE_HIT

#define OI_SUMMARY_BUCKETS 608
#define OI_SUMMARY_PARTS 6

/* One writer's observations of the last minute. */
typedef struct oi_summary_s {
    _Atomic uint64_t part_epoch[OI_SUMMARY_PARTS]; /* which 10 s period each part holds */
    _Atomic uint32_t counts[OI_SUMMARY_PARTS][OI_SUM_KINDS][OI_SUMMARY_BUCKETS];
} oi_summary_t;

/* Returns a zeroed summary, or NULL (out of memory). Free with free(). */
oi_summary_t *oi_summary_new(void);

/* Observes one successful request's durations in microseconds (`us`, one per request kind) at
 * monotonic time `now_ns`. The summary's one writer only. */
void oi_summary_observe(oi_summary_t *s, const uint64_t us[OI_SUM_REQUEST_KINDS], uint64_t now_ns);

/* Observes one duration of `kind` from any thread, with atomic adds: a part that turns over
 * while others write may lose their few observations (the estimate is approximate anyway). */
void oi_summary_observe_shared(oi_summary_t *s, oi_summary_kind_t kind, uint64_t us, uint64_t now_ns);

/* Adds the last minute's counts of `kind` in `s` (as of `now_ns`) into `into`. Any thread. */
void oi_summary_merge(const oi_summary_t *s, oi_summary_kind_t kind, uint64_t now_ns,
                      uint64_t into[OI_SUMMARY_BUCKETS]);

/* Quantile `q` (0..1) of merged counts, in microseconds; NaN when there are none. */
double oi_summary_quantile(const uint64_t counts[OI_SUMMARY_BUCKETS], double q);

#endif
