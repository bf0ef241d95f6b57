/* _core.TensorBase, ResponseBase and RequestBase: the C halves of pb_utils.Tensor,
 * InferenceResponse and InferenceRequest (see pb_objects.c). */
#ifndef OI_PYTHON_PB_OBJECTS_H
#define OI_PYTHON_PB_OBJECTS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Each is a fixed number of object fields, read and written by Python as members. */
typedef struct {
    PyObject_HEAD PyObject *field[];
} oi_pb_object_t;

/* A Tensor's: str, numpy.ndarray (an input's read-only view, or the model's output), str (its
 * V2 datatype). */
enum { OI_PB_TENSOR_NAME, OI_PB_TENSOR_ARRAY, OI_PB_TENSOR_DATATYPE, OI_PB_TENSOR_FIELDS };
/* A response's: list of Tensor, TritonError or None, JSON text or None. */
enum { OI_PB_RESPONSE_OUTPUTS, OI_PB_RESPONSE_ERROR, OI_PB_RESPONSE_PARAMETERS, OI_PB_RESPONSE_FIELDS };
/* A request's, as pb_utils.InferenceRequest names them (`_model_name`, ...). */
enum {
    OI_PB_REQUEST_MODEL_NAME,
    OI_PB_REQUEST_INPUTS,
    OI_PB_REQUEST_REQUESTED,
    OI_PB_REQUEST_ID,
    OI_PB_REQUEST_CORRELATION_ID,
    OI_PB_REQUEST_FLAGS,
    OI_PB_REQUEST_TIMEOUT,
    OI_PB_REQUEST_MODEL_VERSION,
    OI_PB_REQUEST_PARAMETERS,
    OI_PB_REQUEST_CANCELLED,
    OI_PB_REQUEST_SENDER,
    OI_PB_REQUEST_DECOUPLED,
    OI_PB_REQUEST_RELEASE_FLAGS,
    OI_PB_REQUEST_FIELDS
};

#define OI_PB_FIELD(obj, i) (((oi_pb_object_t *)(obj))->field[i])

extern PyTypeObject oi_py_pb_tensor_type;
extern PyTypeObject oi_py_pb_response_type;
extern PyTypeObject oi_py_pb_request_type;

/* pb_utils.get_input_tensor_by_name (the module functions here). */
extern PyMethodDef oi_py_pb_functions[];

#endif
