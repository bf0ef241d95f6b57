/* _core.TritonExecute: the core's own call of a Triton Python model's execute (see
 * triton_execute.c). */
#ifndef OI_PYTHON_TRITON_EXECUTE_H
#define OI_PYTHON_TRITON_EXECUTE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "core/tensor.h"

extern PyTypeObject oi_py_triton_execute_type;

/* Runs the model's execute for `req` (a lone request or a dynamic batch, not decoupled), `flag`
 * its cancel flag, `names` the n outputs asked. Returns a new reference: a lone request's own
 * response (a pb_utils.InferenceResponse holding every asked output, read with
 * oi_py_triton_output), or a mapping of outputs as a handler returns (a batch's joined by
 * rows, or what the adapter's _conclude made of any other outcome); NULL with the exception
 * set. Needs the GIL. */
PyObject *oi_py_triton_execute(PyObject *self, const oi_request_t *req, const char *const *names, uint32_t n,
                               PyObject *flag);

/* The array of the response's output `name` (borrowed; the last of that name), or NULL. */
PyObject *oi_py_triton_output(PyObject *response, const char *name);

#endif
