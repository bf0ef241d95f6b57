/* What the module's parts for the C core's own backends (onnx_module.c, torch_module.c) share:
 * reading the spec dicts that python/openinfer's onnx_model and torch_model make, and handing
 * their backends' JSON descriptions to Python. */
#ifndef OI_PYTHON_SPEC_H
#define OI_PYTHON_SPEC_H

#include "core/tensor.h"
#include "python/numpy_api.h"

/* spec[key] as an int, `dflt` when it is absent or None; -1 with an exception when it is not
 * an int. */
int oi__py_spec_int(PyObject *spec, const char *key, int dflt);

/* A reshape from a spec: None gives ndim -1 (none), a sequence of at most OI_MAX_DIMS ints
 * that shape. Returns 0, or -1 with an exception whose message starts with `what`. */
int oi__py_spec_reshape(PyObject *v, const char *what, oi_io_spec_t *out);

/* A backend's JSON answer as a new str; takes `json` and `err` (both malloc'd). With `json`
 * NULL, a RuntimeError with `err`'s message (none: out of memory), and NULL. */
PyObject *oi__py_json_str(char *json, char *err);

#endif
