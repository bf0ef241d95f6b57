/* Triton's ensembles (platform "ensemble", ensemble_scheduling): a model whose requests run a
 * graph of other served models. Each step is sent to its model's scheduler as soon as every
 * ensemble tensor it reads exists, so steps that do not depend on each other run at once;
 * tensors pass from step to step as references to the producing response's buffers (no
 * byte is copied), and the ensemble's answer references the steps' outputs the same way.
 *
 * The ensemble is a backend (oi_ensemble_backend): its model has its own scheduler, queue and
 * statistics, and each request holds one of the ensemble's executors while its steps run on
 * their models' executors. Steps are real requests to their models, counted in their
 * statistics. The graph is checked before it gets here (python/openinfer/ensemble.py); step
 * models are looked up by name at each request, so a step model reloaded or unloaded under
 * the ensemble is seen by the next request. */
#ifndef OI_SERVER_SCHED_ENSEMBLE_H
#define OI_SERVER_SCHED_ENSEMBLE_H

#include <stdint.h>

#include "backends/backend.h"
#include "server/models/registry.h"

/* How many requests one ensemble runs at once: its executors mostly wait for the steps. */
#define OI_ENSEMBLE_EXECUTORS 32

/* One mapping of a step: the step model's tensor name and the ensemble tensor's name. */
typedef struct oi_ensemble_map_s {
    const char *model_tensor;
    const char *ensemble_tensor;
} oi_ensemble_map_t;

/* One step as configured (borrowed strings; oi_ensemble_new copies them). */
typedef struct oi_ensemble_step_spec_s {
    const char *model_name;
    int64_t model_version;           /* -1: the model's default version */
    const oi_ensemble_map_t *inputs; /* step input <- ensemble tensor */
    uint32_t n_inputs;
    const oi_ensemble_map_t *outputs; /* step output -> ensemble tensor */
    uint32_t n_outputs;
} oi_ensemble_step_spec_t;

typedef struct oi_ensemble_s oi_ensemble_t;

/* Runs requests of ensemble `self` over `reg` (borrowed: it outlives every model in it; `self`
 * borrowed too: the model owns the state returned). `count_stats`: the steps are counted in
 * their models' statistics. Tensors pass between models that batch and models that do not as
 * Triton's ensemble scheduler passes them (a batch of one where the shapes say so). A decoupled
 * step's every response is a new iteration of its outputs, sent on to the steps after it (the
 * ensemble model is then decoupled: each complete iteration of its outputs is one answer).
 * `max_inflight`: Triton's max_inflight_requests, the runs of one step in flight at once over
 * all requests (a step past it holds whoever sends it); 0: no limit. Returns the
 * backend state (freed by oi_ensemble_backend.release), or NULL when out of memory. */
oi_ensemble_t *oi_ensemble_new(oi_registry_t *reg, const oi_model_t *self, int count_stats,
                               const oi_ensemble_step_spec_t *steps, uint32_t n_steps, uint32_t max_inflight);

extern const oi_backend_t oi_ensemble_backend;

#endif
