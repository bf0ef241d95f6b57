/* Served models by name and numeric version, each with its I/O declaration, metadata and
 * scheduler. Read by every loop thread; written at start-up and by model loads and unloads,
 * which swap entries under a read-write lock while requests go on. */
#ifndef OI_SERVER_MODELS_REGISTRY_H
#define OI_SERVER_MODELS_REGISTRY_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/tensor.h"
#include "server/sched/scheduler.h"
#include "server/sched/sequence.h"

/* One version of one model. Refcounted: the registry holds one reference and each request
 * in flight another. */
typedef struct oi_model_s {
    atomic_int refs;
    char *name;
    /* The model's namespace (its repository, with --model-namespacing); NULL: none. Models
     * of one name in several namespaces are served side by side: a request by that name alone
     * is ambiguous, an ensemble's step finds its own namespace's first (oi_registry_find_in). */
    char *ns;
    int64_t version;
    char version_str[24];
    int max_batch_size;
    int decoupled; /* 0..N responses per request (Triton's model_transaction_policy) */
    /* The model answers its own readiness (a Triton Python model's is_ready()): a ready check
     * asks the application on a control thread (OI_REPO_READY) instead of answering at once. */
    int ready_probe;
    oi_io_spec_t *inputs;
    uint32_t n_inputs;
    oi_io_spec_t *outputs;
    uint32_t n_outputs;
    const char **output_names; /* outputs[i].name, for requests that name none */
    struct oi_labels_s **labels; /* per output, its label file's lines (NULL: none); NULL when no
                                  * output has one. Owned; immutable once published */
    /* OpenAI's API: the model's own names for the tensors of Triton's LLM conventions, as
     * n_openai_names pairs {convention's name, model's name} (config.pbtxt's openai_<name>
     * parameters); NULL: the conventions' names. Owned; immutable once published. */
    char **openai_names;
    uint32_t n_openai_names;
    oi_buf_t *metadata;        /* the model metadata JSON body */
    oi_buf_t *config_json;     /* the model configuration in Triton's JSON; NULL when unknown */
    oi_buf_t *config_pb;       /* the same as a serialized inference.ModelConfig; NULL likewise */
    char *error;               /* why the version is not ready; NULL when ready */
    const oi_backend_t *backend;
    void *state;
    oi_scheduler_t *sched; /* NULL when not ready */
    oi_seq_t *seq;         /* the sequence batcher in front of sched; NULL: none */
    uint64_t load_ns;      /* how long loading it took (nv_model_load_duration_secs); set before
                            * it is published, 0 when unknown */
    /* The server's response cache when the model enabled it (response_cache { enable: true })
     * and the server has one; borrowed, set before the model is published. NULL: none. */
    struct oi_rcache_s *cache;
    /* Requests answered from the cache and requests that missed it, with the time spent
     * looking up (and, for misses, keeping the answer): Triton's cache_hit and cache_miss. */
    atomic_uint_fast64_t cache_hits, cache_hit_ns, cache_misses, cache_miss_ns;
    struct oi_model_s *next;
} oi_model_t;

typedef struct oi_registry_s {
    pthread_rwlock_t lock;
    oi_model_t *models;
} oi_registry_t;

/* Returns a new model with one reference and copies of name and specs, or NULL. The backend
 * and scheduler are attached by the caller. */
oi_model_t *oi_model_new(const char *name, int64_t version, int max_batch_size, const oi_io_spec_t *inputs,
                         uint32_t n_inputs, const oi_io_spec_t *outputs, uint32_t n_outputs);

void oi_model_ref(oi_model_t *m);

/* Drops a reference; the last frees the model's memory (its scheduler must be gone). */
void oi_model_unref(oi_model_t *m);

void oi_registry_init(oi_registry_t *r);

/* Adds a model, taking the caller's reference. Returns 0, or -1 when that namespace, name
 * and version are already registered (the reference is then still the caller's). */
int oi_registry_add(oi_registry_t *r, oi_model_t *m);

/* Finds a model version: `version` NULL or "" picks the highest ready version (else the
 * highest). Returns a new reference, or NULL with a status in *err worded as Triton words it:
 * 404 "Request for unknown model: 'x' is not found" (or "... 'x' version 3 is not found"),
 * 400 when `version` is not a decimal number, 400 when models of that name are in several
 * namespaces (Triton's "model namespace must be provided to resolve ambiguity"). */
oi_model_t *oi_registry_find(oi_registry_t *r, const char *name, const char *version, oi_status_t **err);

/* As oi_registry_find, looking in namespace `ns` first: a model of that name there is the one
 * found; without one, the name resolves as oi_registry_find resolves it (as Triton resolves an
 * ensemble's step: its own namespace's model, else the only one of that name). */
oi_model_t *oi_registry_find_in(oi_registry_t *r, const char *ns, const char *name, const char *version,
                                oi_status_t **err);

/* How many namespaces hold a model named `name` (0 when none; 1 without namespacing). */
int oi_registry_namespaces(oi_registry_t *r, const char *name);

/* Calls `fn` for each ready version (no error, a scheduler) of model `name`, or of every
 * model when `name` is NULL, under the registry's read lock: while `fn` runs, the version
 * stays registered and its scheduler (with its statistics) alive. `fn` must be quick and
 * must not call back into the registry; a non-zero return stops the walk and is returned. */
int oi_registry_visit_ready(oi_registry_t *r, const char *name, int (*fn)(void *ctx, oi_model_t *m), void *ctx);

/* As oi_registry_visit_ready, for every registered version, ready or not (a version that
 * failed to load has `error` set and may have no scheduler). */
int oi_registry_visit(oi_registry_t *r, const char *name, int (*fn)(void *ctx, oi_model_t *m), void *ctx);

/* 1 when every model's default version is ready (and there is at least one model or none
 * failed), else 0. */
int oi_registry_all_ready(oi_registry_t *r);

/* Swaps entries in one step, as a load or unload does: each of `add` (the caller's
 * references, taken) replaces the entry of its namespace, name and version if there is one, and
 * every entry named in `remove` (namespace, name and version; `remove_ns` NULL: none) leaves.
 * The entries that left are returned in *retired (a new array, NULL when none; its length in
 * *n_retired), each with the registry's reference, for the caller to pass to oi_model_retire.
 * Returns 0, or -1 when out of memory (nothing changed, `add` still the caller's). */
int oi_registry_swap(oi_registry_t *r, oi_model_t **add, size_t n_add, const char *const *remove_ns,
                     const char *const *remove_names, const int64_t *remove_versions, size_t n_remove,
                     oi_model_t ***retired, size_t *n_retired);

/* Ends a model version that no longer takes requests (out of the registry, or never in it):
 * waits until the caller's reference is the last (every request admitted to it has been
 * answered), then stops its executors, releases its backend and drops the reference. Blocks
 * while requests finish: never call it on a loop thread, nor holding the GIL (executors may
 * need it to finish). */
void oi_model_retire(oi_model_t *m);

/* oi_model_retire, waiting at most `timeout_ms` (< 0: no bound) for the requests admitted to
 * `m`. Past it, its queued requests fail (503), its backend aborts the running ones (the
 * process backend kills its workers) and they get a short grace. Returns 0 when `m` is
 * retired; 1 when an execute still runs (an in-process model that never returns): `m` is then
 * abandoned to a detached thread that retires it if that execute ever returns (its executors
 * and state stay until then). */
int oi_model_retire_within(oi_model_t *m, int64_t timeout_ms);

/* Fails every model's queued jobs with 503 now, without waiting for the ones running (see
 * oi_scheduler_cancel_queued); the registry stays usable for oi_registry_destroy. */
void oi_registry_cancel_queued(oi_registry_t *r);

/* Stops every scheduler (queued jobs fail with 503), releases backends and drops the
 * registry's references. The caller must not hold the GIL: executors may need it. */
void oi_registry_destroy(oi_registry_t *r);

#endif
