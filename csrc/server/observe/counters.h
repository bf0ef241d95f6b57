/* The counters written on the hot path: per model version inference statistics (Triton's
 * statistics extension, observe/statistics.c, and the per-model Prometheus metrics are both
 * read from here). Counting happens where the work does, on the
 * executor threads: each executor owns one slot and is its only writer, so the hot path takes
 * no lock and no locked instruction; readers (the statistics and metrics endpoints) add the
 * slots up. Requests failed off the executors (queued jobs at shutdown) go to one shared slot
 * written with atomic read-modify-write. */
#ifndef OI_SERVER_OBSERVE_COUNTERS_H
#define OI_SERVER_OBSERVE_COUNTERS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "server/observe/summary.h"

/* Why a request that reached the model failed: Triton's label values of
 * nv_inference_request_failure{reason}. */
typedef enum {
    OI_FAIL_REJECTED = 0, /* never ran: the server refused or dropped it from the queue */
    OI_FAIL_CANCELED,
    OI_FAIL_BACKEND, /* the model ran and failed, or its outputs were unusable */
    OI_FAIL_OTHER,
    OI_FAIL_REASONS
} oi_fail_reason_t;

/* The reason's label value ("REJECTED", ...). */
const char *oi_fail_reason_name(oi_fail_reason_t r);

/* Upper bounds, in milliseconds, of the first-response latency histogram (Triton's default
 * buckets of nv_inference_first_response_histogram_ms); one more bucket holds the rest. */
#define OI_HIST_BUCKETS 4
extern const uint64_t oi_hist_bounds_ms[OI_HIST_BUCKETS];

typedef struct oi_batch_table_s oi_batch_table_t;

/* One writer's counters; durations in nanoseconds. Aligned so that two writers never share
 * a cache line. */
typedef struct oi_stats_slot_s {
    _Atomic uint64_t success, success_ns, queue_ns, input_ns, infer_ns, output_ns, inferences;
    _Atomic uint64_t fail[OI_FAIL_REASONS], fail_ns;
    _Atomic uint64_t executions, last_execution; /* last_execution: when one last ended (monotonic) */
    _Atomic uint64_t hist[OI_HIST_BUCKETS + 1], hist_sum_ms;
    _Atomic(oi_batch_table_t *) batches; /* per batch size; grown by the writer */
    oi_summary_t *summary;               /* latency summaries; NULL: off (set before serving) */
    int shared;                          /* written by several threads: atomic adds */
    uint64_t last_end;                   /* the writer's own: when its last request (its batch) ended */
} __attribute__((aligned(64))) oi_stats_slot_t;

/* The statistics of one model version: `nslots` executor slots and the shared one. Owned by
 * the version's scheduler; lives as long as it. */
typedef struct oi_stats_s {
    int nslots;
    oi_summary_t *cache_summary; /* the response cache's hits and misses (any thread); NULL: off */
    oi_stats_slot_t shared;
    oi_stats_slot_t slots[];
} oi_stats_t;

/* Returns zeroed statistics with `nslots` executor slots, or NULL (out of memory). */
oi_stats_t *oi_stats_new(int nslots);

void oi_stats_free(oi_stats_t *s);

/* Gives every executor slot latency summaries (--metrics-config summary_latencies=true), and
 * the model's response cache one when `cache`. Before the statistics are written. 0, or -1
 * when out of memory. */
int oi_stats_enable_summaries(oi_stats_t *s, int cache);

/* One request's trip, as its job recorded it (CLOCK_MONOTONIC ns). */
typedef struct oi_stats_times_s {
    uint64_t start;         /* accepted for the model: the queue starts */
    uint64_t compute_start; /* its execution began (0: it never ran) */
    uint64_t input_end;     /* the batch's inputs were ready */
    uint64_t output_start;  /* the model returned */
} oi_stats_times_t;

/* Counts one finished request: success with `rows` inferences, or failure for `reason`.
 * `end` is now (also noted in slot->last_end); end - start, in whole milliseconds, also goes
 * into the histogram. Writer of `slot` only (or any thread for the shared slot). */
void oi_stats_request(oi_stats_slot_t *slot, const oi_stats_times_t *t, uint64_t end, int ok, oi_fail_reason_t reason,
                      uint64_t rows);

/* Counts one model execution of `batch_size` rows (all of its requests together), which
 * ended at `end`. Writer of `slot` only. */
void oi_stats_execution(oi_stats_slot_t *slot, uint64_t batch_size, uint64_t compute_start, uint64_t input_end,
                        uint64_t output_start, uint64_t end);

/* A duration statistic: how often, and how long in all. */
typedef struct oi_stat_duration_s {
    uint64_t count, ns;
} oi_stat_duration_t;

typedef struct oi_batch_stats_s {
    uint64_t batch_size;
    oi_stat_duration_t compute_input, compute_infer, compute_output;
} oi_batch_stats_t;

/* The sum of every slot at one moment (each counter read once; counters written while it is
 * read may be one request apart). last_inference_ms is the wall clock (ms since the epoch) of
 * the last execution's end, converted when read so that the request path reads no wall clock. */
typedef struct oi_stats_snapshot_s {
    uint64_t inference_count, execution_count, last_inference_ms;
    oi_stat_duration_t success, fail, queue, compute_input, compute_infer, compute_output;
    uint64_t fail_by_reason[OI_FAIL_REASONS];
    uint64_t hist[OI_HIST_BUCKETS + 1], hist_sum_ms;
    oi_batch_stats_t *batches; /* ascending batch size; owned, free with oi_stats_snapshot_clear */
    size_t n_batches;
} oi_stats_snapshot_t;

/* Reads `s` into `out`. 0, or -1 when out of memory (then `out` holds no batches). */
int oi_stats_read(const oi_stats_t *s, oi_stats_snapshot_t *out);

void oi_stats_snapshot_clear(oi_stats_snapshot_t *snap);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t oi_now_ns(void);

#endif
