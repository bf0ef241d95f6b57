/* Python models whose instances are worker processes (instance_group count > 1 of a Python
 * model): each executor thread of the model's scheduler hands its request to an idle worker
 * through shared memory and waits for the answer, so the model runs on as many cores as it
 * has instances and the server takes no GIL for it. The wire is in process_wire.h. */
#ifndef OI_BACKENDS_PROCESS_BACKEND_H
#define OI_BACKENDS_PROCESS_BACKEND_H

#include <stddef.h>

#include "backends/backend.h"
#include "backends/process_bls.h"

extern const oi_backend_t oi_process_backend;

/* How to start one worker: `argv` and `envp` (NULL-terminated, copied) for posix_spawn, and
 * `recipe`, the bytes the worker reads from its job area to import the model. */
typedef struct oi_process_spec_s {
    char *const *argv;
    char *const *envp;
    const void *recipe;
    size_t recipe_len;
    size_t ring_bytes; /* each worker's result ring; results larger go in memfds of their own */
    /* NULL, or a byte the caller sets (to non-zero, from any thread) to give the start up: an
     * unload of the model, or a client that has gone. Read while the start runs only. */
    const unsigned char *stop;
    /* How the workers' BLS requests run (copied); NULL: they are refused. */
    const oi_pw_bls_hook_t *bls;
} oi_process_spec_t;

/* Starts `n` workers of model `model_name` and waits until each has imported the model, with
 * at most one worker importing per usable CPU at a time (the next starts as one is ready), so
 * that a model of many instances does not fork them all at once. Returns the backend's state,
 * or NULL with the reason in `err` (a worker's own import error, why it could not start, or
 * that spec->stop was set); no worker is left running then. Blocks for as long as the imports
 * take: call without the GIL. */
void *oi_process_backend_start(const char *model_name, int n, const oi_process_spec_t *spec, char *err,
                               size_t errlen);

#endif
