/* _core.worker_serve / worker_fail: the worker process end of a Python model's process
 * instances (backends/process_backend.c is the server's end). */
#ifndef OI_PYTHON_WORKER_H
#define OI_PYTHON_WORKER_H

#include "python/numpy_api.h"

extern PyMethodDef oi_py_worker_functions[];

#endif
