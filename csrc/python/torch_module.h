/* The torch parts of openinfer._core: loading the shim, describing a TorchScript file, and
 * building a torch model's backend state from the spec that python/openinfer/torch_model.py
 * makes. Kept apart from module.c so that the Python backend's path stays as it is. */
#ifndef OI_PYTHON_TORCH_MODULE_H
#define OI_PYTHON_TORCH_MODULE_H

#include "python/numpy_api.h"

#include "server/models/registry.h"

/* Module-level functions: torch_open_shim(path) and torch_describe(path). */
extern PyMethodDef oi_py_torch_functions[];

/* Loads the torch backend state for model `m` from the dict `spec` (see add_model's `torch`
 * argument in _core.pyi), releasing the GIL while the modules load. Returns the state; or
 * NULL with *load_error set to a new message (free() it) when the model cannot load, which
 * makes it unavailable; or NULL with a Python exception set when `spec` is malformed. */
void *oi_py_torch_state(oi_model_t *m, PyObject *spec, char **load_error);

#endif
