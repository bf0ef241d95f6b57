/* Models that are Python callables. The executor takes the GIL only around the call. */
#ifndef OI_BACKENDS_PYTHON_BACKEND_H
#define OI_BACKENDS_PYTHON_BACKEND_H

#include "python/numpy_api.h"

#include "backends/backend.h"

extern const oi_backend_t oi_python_backend;

/* Returns the state for one model version around `handler` (a new reference is taken) whose
 * results are converted to the declared output datatypes, or NULL when out of memory.
 * `handler(inputs, parameters, output_names, cancelled)` follows the contract in
 * python/openinfer/_core.pyi. A model that is not decoupled and whose function takes the
 * inputs alone may also give `fn` and `select` (else NULL): then fn(inputs) is called
 * directly, and select(result, output_names) only for a result that is not a dict holding
 * every requested output (it returns the outputs to send or raises). A Triton Python model
 * may give `triton` (a _core.TritonExecute, else NULL): execute is then called from here
 * (python/triton_execute.c), `handler` serving a decoupled model's streams alone. */
void *oi_python_backend_state(PyObject *handler, PyObject *fn, PyObject *select, PyObject *triton,
                              const char *model_name, const oi_io_spec_t *outputs, uint32_t n_outputs);

/* Whether this thread, which holds the GIL, runs Python with the state an executor of this
 * backend made for it (enter_python): a job of the backend may then run here, taking the GIL
 * back with that same state. Any other thread (one Python started, an asyncio loop's) must not,
 * since enter_python would adopt its state for good. */
int oi_python_backend_on_executor(void);

#endif
