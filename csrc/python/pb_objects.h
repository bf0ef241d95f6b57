/* _core.TensorBase and ResponseBase, the C halves of pb_utils.Tensor and InferenceResponse (see pb_objects.c). */
#ifndef OI_PYTHON_PB_OBJECTS_H
#define OI_PYTHON_PB_OBJECTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

extern PyTypeObject oi_py_pb_tensor_type;
extern PyTypeObject oi_py_pb_response_type;

#endif
