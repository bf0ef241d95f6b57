/* The ONNX Runtime parts of openinfer._core: loading the library, describing an ONNX file,
 * and building an ONNX model's backend state from the spec that
 * python/openinfer/onnx_model.py makes. */
#ifndef OI_PYTHON_ONNX_MODULE_H
#define OI_PYTHON_ONNX_MODULE_H

#include "python/numpy_api.h"

#include "server/models/registry.h"

/* Module-level functions: onnx_open(path) -> (version, api_version), onnx_describe(spec) and
 * onnx_providers(), added to the module at init. */
extern PyMethodDef oi_py_onnx_functions[];

/* Creates the sessions of model `m` from the dict `spec` (see add_model's `onnx` argument in
 * _core.pyi), releasing the GIL meanwhile. Returns the state; or NULL with *load_error set
 * to a new message (free() it) when the model cannot load, which makes it unavailable; or
 * NULL with a Python exception set when `spec` is malformed. */
void *oi_py_onnx_state(oi_model_t *m, PyObject *spec, char **load_error);

#endif
