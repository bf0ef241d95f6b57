/* The statistics extension's read side: which model versions a request names (Triton's
 * selection and error wording) and their counters at one moment, rendered as Triton's JSON.
 * The gRPC and metrics renderings read the same collection. Off the hot path: it runs when a
 * client asks. */
#ifndef OI_SERVER_OBSERVE_STATISTICS_H
#define OI_SERVER_OBSERVE_STATISTICS_H

#include "core/buf.h"
#include "core/status.h"
#include "server/models/registry.h"

/* One ready model version's statistics. */
typedef struct oi_model_stats_s {
    oi_model_t *model; /* one reference: name and version_str stay valid */
    oi_stats_snapshot_t snap; /* snap.success includes the cache hits, as Triton counts them */
    int pending;              /* requests queued, not yet executing */
    oi_stat_duration_t cache_hit, cache_miss; /* the response cache's (oi_model_t counters) */
} oi_model_stats_t;

/* Collects the ready versions that `name` and `version` name: every model's when `name` is
 * NULL or empty, every version of `name` when `version` is NULL or empty, else that one.
 * Sorted by name, then version. Returns NULL with a new array in *out (release it with
 * oi_statistics_release), or a 400 status worded as Triton's: "requested model 'x' is not
 * available", "requested model version is not available for model 'x'", or a version that is
 * not a number. */
oi_status_t *oi_statistics_collect(oi_registry_t *r, const char *name, const char *version, oi_model_stats_t **out,
                                   size_t *n);

void oi_statistics_release(oi_model_stats_t *items, size_t n);

/* Triton's statistics body: {"model_stats":[{"name", "version", "last_inference",
 * "inference_count", "execution_count", "inference_stats", "response_stats", "batch_stats",
 * "memory_usage"}]}. 0, or -1 when out of memory. */
int oi_statistics_json(oi_sbuf_t *out, const oi_model_stats_t *items, size_t n);

#endif
