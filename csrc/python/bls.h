/* Business logic scripting (BLS): a model's own inference on the server that runs it, built in
 * memory and queued on the target model's scheduler, never through a socket. */
#ifndef OI_PYTHON_BLS_H
#define OI_PYTHON_BLS_H

#include "python/numpy_api.h"
#include "backends/process_bls.h"
#include "server/models/registry.h"

/* The type of the calls oi_py_bls_start returns (openinfer._core.BlsCall). */
extern PyTypeObject oi_py_bls_type;

/* Server.bls(model, version, inputs, outputs, request_id=None, parameters=None, timeout_us=0,
 * sequence_id=0, sequence_id_str=None, sequence_start=False, sequence_end=False): `inputs` a
 * list of (name, datatype, array), `outputs` a list of names (empty: all). Returns a new
 * BlsCall; a request refused before it was queued (unknown model, bad input) is a call that
 * has ended with that error. `counted`: count it in the target's statistics. */
PyObject *oi_py_bls_start(oi_registry_t *reg, int counted, PyObject *args, PyObject *kwargs);

/* The hook (oi_pw_bls_hook_t, process_bls.h) that serves worker processes' BLS requests;
 * `ctx` is the oi_server_t. Called without the GIL. */
void *oi_py_bls_worker_start(void *ctx, const char *model, const char *version, oi_request_t *req, uint32_t flags,
                             int wake_fd, oi_status_t **st);
int oi_py_bls_worker_next(void *call, oi_response_t *resp, oi_status_t **st);
void oi_py_bls_worker_cancel(void *call);
void oi_py_bls_worker_release(void *call);

#endif
