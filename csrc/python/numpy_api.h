/* Includes the numpy C API with one shared function table for the whole extension: the
 * module init (OI_NUMPY_IMPORT defined) fills it, every other file uses it. */
#ifndef OI_PYTHON_NUMPY_API_H
#define OI_PYTHON_NUMPY_API_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define PY_ARRAY_UNIQUE_SYMBOL oi_numpy_api
#ifndef OI_NUMPY_IMPORT
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#endif
