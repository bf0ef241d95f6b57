/* The one interface every model runtime implements. Nothing outside a backend knows which
 * runtime serves a model. */
#ifndef OI_BACKENDS_BACKEND_H
#define OI_BACKENDS_BACKEND_H

#include "core/tensor.h"

typedef struct oi_backend_s {
    const char *name;
    /* Runs one request on an executor thread (or a loop thread: see runs_on_loop). Fills resp->outputs with
     * exactly the named outputs, in that order. `state` is the model's, made by the backend's
     * own loader. Returns NULL or a status (400 for the caller's mistakes, 500 otherwise). */
    oi_status_t *(*execute)(void *state, const oi_request_t *req, const char *const *output_names,
                            uint32_t n_outputs, oi_response_t *resp);
    /* Frees the model's state; called once, after the last execute returned. */
    void (*release)(void *state);
    /* Optional: ends what running executes wait on, so that they return soon with an error
     * (the process backend kills its workers); called from another thread while they run,
     * when an unload's bound has passed. release still follows once they have returned. */
    void (*abort)(void *state);
    /* Optional: called on each executor thread as it ends, after its last execute, while the
     * thread is still whole (its thread-specific data not yet torn down). */
    void (*thread_end)(void *state);
    /* execute blocks on nothing but its own computation: never on the server (a request to
     * it), another process or a client, and keeps no per-thread state. Then a call that has
     * been quick may run on the loop thread that received the request (oi_scheduler_submit).
     * Not for models that run users' Python, which may call the server back. */
    int runs_on_loop;
    /* execute may run on the thread of a model that asked for the request by BLS and blocks
     * until it ends (oi_scheduler_submit_on_caller): an executor of the Python backend, which
     * holds no lock and no loop while it waits. runs_on_loop implies it. */
    int runs_on_caller;
} oi_backend_t;

#endif
