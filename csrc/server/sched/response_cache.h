/* Triton's response cache (`--cache-config local,size=N`; a model opts in with
 * `response_cache { enable: true }`): the outputs of a request are kept, keyed by the model
 * version and everything in the request that can change them, and a later request with the
 * same key is answered from the cache without running the model. One LRU shared by every
 * model, bounded in bytes (keys, names and tensor bytes counted); an entry larger than the
 * whole cache is not kept. Any thread: one mutex, taken only by requests to models that
 * enabled the cache. */
#ifndef OI_SERVER_SCHED_RESPONSE_CACHE_H
#define OI_SERVER_SCHED_RESPONSE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

typedef struct oi_rcache_s oi_rcache_t;

/* A cache of at most `capacity` bytes (> 0), or NULL when out of memory. */
oi_rcache_t *oi_rcache_new(size_t capacity);

/* Frees the cache; responses handed out keep their tensors (they hold references). */
void oi_rcache_free(oi_rcache_t *c);

/* What identifies a request's answer: the model version, the inputs (name, datatype, shape,
 * bytes), the outputs asked for (name and classification count, in order) and the request
 * parameters other than the scheduler's own (priority, timeout) and the encoding's. `outputs`
 * are the names the request resolves to (n_outputs of them); `class_counts` may be NULL. */
typedef struct oi_rcache_request_s {
    const char *model;
    int64_t version;
    const oi_request_t *req;
    const char *const *outputs;
    uint32_t n_outputs;
    const uint32_t *class_counts;
} oi_rcache_request_t;

/* On a hit fills `resp` (empty) with the cached outputs, sharing their bytes (no copy), and
 * returns 1; 0 on a miss; -1 when out of memory (treated as a miss by callers). */
int oi_rcache_lookup(oi_rcache_t *c, const oi_rcache_request_t *r, oi_response_t *resp);

/* Keeps a copy of `resp`, the answer to `r`, evicting the least recently used entries to make
 * room. Returns 0, or -1 when it was not kept (too large, or out of memory). */
int oi_rcache_insert(oi_rcache_t *c, const oi_rcache_request_t *r, const oi_response_t *resp);

/* Entries and bytes held, for tests and metrics. */
void oi_rcache_usage(oi_rcache_t *c, size_t *entries, size_t *bytes);

#endif
