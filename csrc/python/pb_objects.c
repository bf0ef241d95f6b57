/* _core.TensorBase, ResponseBase and RequestBase: the C halves of pb_utils.Tensor,
 * InferenceResponse and InferenceRequest (python/openinfer/_backends/triton_utils.py), the
 * objects a Triton Python model is given for each request, makes for each output and each
 * response, and reads each input through; and get_input_tensor_by_name. Their
 * construction and plain reads run for every request, so they are C here: a Python __init__
 * or method costs a frame each (add_sub: nine of them per request). The Python subclasses keep
 * everything else (datatype names, DLPack, repr, parameters). */
#include "python/pb_objects.h"

#include "python/numpy_api.h"

#include <structmember.h>

/* A member for field i, named as the Python class names it. */
#define PB_MEMBER(name, i) {name, T_OBJECT_EX, (Py_ssize_t)(sizeof(oi_pb_object_t) + (i) * sizeof(PyObject *)), 0, NULL}

/* One of the three types: `fields` object fields, construction by `init`, plain reads in
 * `methods`, the fields as `members`. */
#define PB_TYPE(cname, fields, init, methods, members, doc)                                                           \
    {                                                                                                                  \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = cname,                                                                \
        .tp_basicsize = sizeof(oi_pb_object_t) + (fields) * sizeof(PyObject *),                                        \
        .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, .tp_new = PyType_GenericNew,       \
        .tp_init = init, .tp_dealloc = pb_object_dealloc, .tp_traverse = pb_object_traverse,                           \
        .tp_clear = pb_object_clear, .tp_methods = methods, .tp_members = members, .tp_doc = doc,                      \
    }

/* How many fields the object has: its C type's (the first below `object`, a Python subclass
 * adding none of its own, as each declares __slots__ = ()). */
static int n_fields(PyObject *self)
{
    PyTypeObject *t = Py_TYPE(self);
    while (t->tp_base != NULL && t->tp_base != &PyBaseObject_Type)
        t = t->tp_base;
    return (int)((t->tp_basicsize - (Py_ssize_t)sizeof(oi_pb_object_t)) / (Py_ssize_t)sizeof(PyObject *));
}

static int pb_object_traverse(PyObject *self, visitproc visit, void *arg)
{
    for (int i = 0, n = n_fields(self); i < n; i++) /* the subclass's traverse visits its type */
        Py_VISIT(OI_PB_FIELD(self, i));
    return 0;
}

static int pb_object_clear(PyObject *self)
{
    for (int i = 0, n = n_fields(self); i < n; i++)
        Py_CLEAR(OI_PB_FIELD(self, i));
    return 0;
}

/* Also the Python subclass's base dealloc: its subtype_dealloc drops the type's reference. */
static void pb_object_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    pb_object_clear(self);
    Py_TYPE(self)->tp_free(self);
}

/* Takes the references of a, b and c into the object's first three fields. */
static void pb_object_set(PyObject *self, PyObject *a, PyObject *b, PyObject *c)
{
    Py_XSETREF(OI_PB_FIELD(self, 0), a);
    Py_XSETREF(OI_PB_FIELD(self, 1), b);
    Py_XSETREF(OI_PB_FIELD(self, 2), c);
}

/* A field read before it was set (a subclass that skipped __init__): AttributeError, as a slot. */
static PyObject *field(PyObject *self, int i, const char *what)
{
    PyObject *value = OI_PB_FIELD(self, i);
    if (value == NULL)
        return PyErr_Format(PyExc_AttributeError, "the object has no %s", what);
    return Py_NewRef(value);
}

/* The datatype of an array's dtype: the subclass's _DATATYPES cache, else its
 * _datatype_of(name, dtype), which fills the cache or raises the TypeError a model sees. */
static PyObject *datatype_of(PyObject *self, PyObject *name, PyObject *array)
{
    static PyObject *cache_name; /* interned once: a lookup by C string makes a str each time */
    if (cache_name == NULL && (cache_name = PyUnicode_InternFromString("_DATATYPES")) == NULL)
        return NULL;
    PyObject *dtype = (PyObject *)PyArray_DESCR((PyArrayObject *)array);
    PyObject *cache = PyObject_GetAttr((PyObject *)Py_TYPE(self), cache_name);
    PyObject *found = cache != NULL && PyDict_Check(cache) ? PyDict_GetItemWithError(cache, dtype) : NULL;
    Py_XDECREF(cache);
    if (found != NULL)
        return Py_NewRef(found);
    if (PyErr_Occurred())
        return NULL;
    return PyObject_CallMethod(self, "_datatype_of", "OO", name, dtype);
}

/* Tensor(name, data, *, _datatype=None), checked as pb_utils' Tensor is. */
static int pb_tensor_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *keywords[] = {"name", "data", "_datatype", NULL};
    PyObject *name, *data, *datatype = Py_None;
    if (kw == NULL && PyTuple_GET_SIZE(args) == 2) { /* Tensor(name, array): no parsing */
        name = PyTuple_GET_ITEM(args, 0);
        data = PyTuple_GET_ITEM(args, 1);
    } else if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|$O:Tensor", keywords, &name, &data, &datatype)) {
        return -1;
    }
    if (!PyUnicode_Check(name) || !PyArray_Check(data)) {
        PyObject *given = (PyObject *)Py_TYPE(PyUnicode_Check(name) ? data : name);
        PyObject *type_name = PyObject_GetAttrString(given, "__name__"); /* as type(x).__name__ */
        if (type_name == NULL)
            return -1;
        if (!PyUnicode_Check(name))
            PyErr_Format(PyExc_TypeError, "Tensor name must be a str, got %S", type_name);
        else
            PyErr_Format(PyExc_TypeError,
                         "Tensor '%U': expected a numpy array, got %S (use Tensor.from_dlpack for a DLPack tensor)",
                         name, type_name);
        Py_DECREF(type_name);
        return -1;
    }
    datatype = datatype == Py_None ? datatype_of(self, name, data) : Py_NewRef(datatype);
    if (datatype == NULL)
        return -1;
    pb_object_set(self, Py_NewRef(name), Py_NewRef(data), datatype);
    return 0;
}

static PyObject *pb_tensor_name(PyObject *self, PyObject *unused)
{
    (void)unused;
    return field(self, OI_PB_TENSOR_NAME, "name");
}

static PyObject *pb_tensor_as_numpy(PyObject *self, PyObject *unused)
{
    (void)unused;
    return field(self, OI_PB_TENSOR_ARRAY, "array");
}

static PyMethodDef pb_tensor_methods[] = {
    {"name", pb_tensor_name, METH_NOARGS, "The tensor's name."},
    {"as_numpy", pb_tensor_as_numpy, METH_NOARGS,
     "The tensor's values (an input: a read-only view of the request; BF16: uint16 bits)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef pb_tensor_members[] = {
    PB_MEMBER("_name", OI_PB_TENSOR_NAME),
    PB_MEMBER("_array", OI_PB_TENSOR_ARRAY),
    PB_MEMBER("_datatype", OI_PB_TENSOR_DATATYPE),
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject oi_py_pb_tensor_type =
    PB_TYPE("openinfer._core.TensorBase", OI_PB_TENSOR_FIELDS, pb_tensor_init, pb_tensor_methods, pb_tensor_members,
            "The C half of pb_utils.Tensor: its fields, construction, name() and as_numpy().");

/* InferenceResponse(output_tensors=None, error=None, parameters=None): the outputs copied into
 * a list of Tensors; an error or parameters go through the subclass's _checked(error,
 * parameters), which checks them and returns them as kept (parameters as JSON text). */
static int pb_response_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *keywords[] = {"output_tensors", "error", "parameters", NULL};
    static PyObject *output_tensors; /* interned once, as the caller's keyword is */
    PyObject *given = Py_None, *error = Py_None, *parameters = Py_None;
    if (output_tensors == NULL && (output_tensors = PyUnicode_InternFromString("output_tensors")) == NULL)
        return -1;
    PyObject *alone = kw != NULL && PyTuple_GET_SIZE(args) == 0 && PyDict_GET_SIZE(kw) == 1
                          ? PyDict_GetItemWithError(kw, output_tensors)
                          : NULL;
    if (alone != NULL) /* InferenceResponse(output_tensors=[...]), the common call: no parsing */
        given = alone;
    else if (PyErr_Occurred() ||
             !PyArg_ParseTupleAndKeywords(args, kw, "|OOO:InferenceResponse", keywords, &given, &error, &parameters))
        return -1;
    int any = given == Py_None ? 0 : PyObject_IsTrue(given);
    PyObject *outputs = any < 0 ? NULL : any ? PySequence_List(given) : PyList_New(0);
    if (outputs == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outputs); i++) {
        PyObject *t = PyList_GET_ITEM(outputs, i);
        if (!PyObject_TypeCheck(t, &oi_py_pb_tensor_type)) {
            PyObject *type_name = PyObject_GetAttrString((PyObject *)Py_TYPE(t), "__name__");
            if (type_name != NULL)
                PyErr_Format(PyExc_TypeError, "InferenceResponse output_tensors must hold pb_utils.Tensor, got %S",
                             type_name);
            Py_XDECREF(type_name);
            Py_DECREF(outputs);
            return -1;
        }
    }
    PyObject *checked = NULL;
    if (error != Py_None || parameters != Py_None) {
        checked = PyObject_CallMethod(self, "_checked", "OO", error, parameters);
        if (checked == NULL || !PyArg_ParseTuple(checked, "OO;_checked returns (error, parameters)", &error, &parameters)) {
            Py_XDECREF(checked);
            Py_DECREF(outputs);
            return -1;
        }
    }
    pb_object_set(self, outputs, Py_NewRef(error), Py_NewRef(parameters));
    Py_XDECREF(checked);
    return 0;
}

static PyObject *pb_response_output_tensors(PyObject *self, PyObject *unused)
{
    (void)unused;
    return field(self, OI_PB_RESPONSE_OUTPUTS, "output tensors");
}

static PyObject *pb_response_error(PyObject *self, PyObject *unused)
{
    (void)unused;
    return field(self, OI_PB_RESPONSE_ERROR, "error");
}

static PyObject *pb_response_has_error(PyObject *self, PyObject *unused)
{
    (void)unused;
    PyObject *error = OI_PB_FIELD(self, OI_PB_RESPONSE_ERROR);
    return PyBool_FromLong(error != NULL && error != Py_None);
}

static PyMethodDef pb_response_methods[] = {
    {"output_tensors", pb_response_output_tensors, METH_NOARGS, "The response's output Tensors."},
    {"has_error", pb_response_has_error, METH_NOARGS, "Whether the response carries an error."},
    {"error", pb_response_error, METH_NOARGS, "The response's TritonError, or None."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef pb_response_members[] = {
    PB_MEMBER("_outputs", OI_PB_RESPONSE_OUTPUTS),
    PB_MEMBER("_error", OI_PB_RESPONSE_ERROR),
    PB_MEMBER("_parameters", OI_PB_RESPONSE_PARAMETERS),
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject oi_py_pb_response_type =
    PB_TYPE("openinfer._core.ResponseBase", OI_PB_RESPONSE_FIELDS, pb_response_init, pb_response_methods,
            pb_response_members, "The C half of pb_utils.InferenceResponse: its fields, construction and plain reads.");

/* The plain reads of a request, each one field. */
#define PB_REQUEST_READ(method, i, what)                                                                               \
    static PyObject *pb_request_##method(PyObject *self, PyObject *unused)                                             \
    {                                                                                                                  \
        (void)unused;                                                                                                  \
        return field(self, i, what);                                                                                   \
    }
PB_REQUEST_READ(inputs, OI_PB_REQUEST_INPUTS, "inputs")
PB_REQUEST_READ(requested_output_names, OI_PB_REQUEST_REQUESTED, "requested output names")
PB_REQUEST_READ(request_id, OI_PB_REQUEST_ID, "request id")
PB_REQUEST_READ(correlation_id, OI_PB_REQUEST_CORRELATION_ID, "correlation id")
PB_REQUEST_READ(flags, OI_PB_REQUEST_FLAGS, "flags")
PB_REQUEST_READ(timeout, OI_PB_REQUEST_TIMEOUT, "timeout")
PB_REQUEST_READ(parameters, OI_PB_REQUEST_PARAMETERS, "parameters")
PB_REQUEST_READ(model_name, OI_PB_REQUEST_MODEL_NAME, "model name")

static PyObject *pb_request_is_cancelled(PyObject *self, PyObject *unused)
{
    (void)unused;
    PyObject *cancelled = OI_PB_FIELD(self, OI_PB_REQUEST_CANCELLED);
    if (cancelled == NULL)
        return PyErr_Format(PyExc_AttributeError, "the object has no cancel flag");
    return PyObject_CallNoArgs(cancelled);
}

static PyMethodDef pb_request_methods[] = {
    {"inputs", pb_request_inputs, METH_NOARGS, "The request's input Tensors."},
    {"requested_output_names", pb_request_requested_output_names, METH_NOARGS, "The outputs the client asked for."},
    {"request_id", pb_request_request_id, METH_NOARGS, "The request's id ('' when none)."},
    {"correlation_id", pb_request_correlation_id, METH_NOARGS, "The sequence id (0 when none)."},
    {"flags", pb_request_flags, METH_NOARGS, "The sequence start and end flags."},
    {"timeout", pb_request_timeout, METH_NOARGS, "The request's timeout in microseconds (0 when none)."},
    {"parameters", pb_request_parameters, METH_NOARGS, "The request's parameters as JSON text."},
    {"model_name", pb_request_model_name, METH_NOARGS, "The model the request is for."},
    {"is_cancelled", pb_request_is_cancelled, METH_NOARGS, "Whether the request's clients have gone."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef pb_request_members[] = {
    PB_MEMBER("_model_name", OI_PB_REQUEST_MODEL_NAME),
    PB_MEMBER("_inputs", OI_PB_REQUEST_INPUTS),
    PB_MEMBER("_requested", OI_PB_REQUEST_REQUESTED),
    PB_MEMBER("_request_id", OI_PB_REQUEST_ID),
    PB_MEMBER("_correlation_id", OI_PB_REQUEST_CORRELATION_ID),
    PB_MEMBER("_flags", OI_PB_REQUEST_FLAGS),
    PB_MEMBER("_timeout", OI_PB_REQUEST_TIMEOUT),
    PB_MEMBER("_model_version", OI_PB_REQUEST_MODEL_VERSION),
    PB_MEMBER("_parameters", OI_PB_REQUEST_PARAMETERS),
    PB_MEMBER("_cancelled", OI_PB_REQUEST_CANCELLED),
    PB_MEMBER("_sender", OI_PB_REQUEST_SENDER),
    PB_MEMBER("_decoupled", OI_PB_REQUEST_DECOUPLED),
    PB_MEMBER("_release_flags", OI_PB_REQUEST_RELEASE_FLAGS),
    {NULL, 0, 0, 0, NULL},
};

/* Construction is the Python subclass's (a model's BLS request) or the core's
 * (triton_execute.c: a served request, no __init__). */
PyTypeObject oi_py_pb_request_type =
    PB_TYPE("openinfer._core.RequestBase", OI_PB_REQUEST_FIELDS, NULL, pb_request_methods, pb_request_members,
            "The C half of pb_utils.InferenceRequest: its fields and plain reads.");

/* get_input_tensor_by_name(inference_request, name): the request's input of that name, or None.
 * The names are compared as Python compares them (the same str object first: a served input's
 * name is the model's own declared str). */
static PyObject *pb_input_tensor_by_name(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *keywords[] = {"inference_request", "name", NULL};
    PyObject *request, *name;
    (void)self;
    if (kw == NULL && PyTuple_GET_SIZE(args) == 2) {
        request = PyTuple_GET_ITEM(args, 0);
        name = PyTuple_GET_ITEM(args, 1);
    } else if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:get_input_tensor_by_name", keywords, &request, &name)) {
        return NULL;
    }
    PyObject *inputs = PyObject_TypeCheck(request, &oi_py_pb_request_type)
                           ? Py_XNewRef(OI_PB_FIELD(request, OI_PB_REQUEST_INPUTS))
                           : PyObject_CallMethod(request, "inputs", NULL);
    if (inputs == NULL)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_AttributeError, "the object has no inputs");
    PyObject *fast = PySequence_Fast(inputs, "inputs() must return a sequence of Tensors"), *found = NULL;
    Py_DECREF(inputs);
    if (fast == NULL)
        return NULL;
    for (Py_ssize_t i = 0; found == NULL && i < PySequence_Fast_GET_SIZE(fast); i++) {
        PyObject *tensor = PySequence_Fast_GET_ITEM(fast, i);
        PyObject *tname = PyObject_TypeCheck(tensor, &oi_py_pb_tensor_type) ? Py_XNewRef(OI_PB_FIELD(tensor, OI_PB_TENSOR_NAME))
                                                                           : PyObject_GetAttrString(tensor, "_name");
        int same = tname == NULL ? -1 : tname == name ? 1 : PyObject_RichCompareBool(tname, name, Py_EQ);
        Py_XDECREF(tname);
        if (same < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_AttributeError, "the tensor has no name");
            Py_DECREF(fast);
            return NULL;
        }
        if (same == 1)
            found = Py_NewRef(tensor);
    }
    Py_DECREF(fast);
    return found != NULL ? found : Py_NewRef(Py_None);
}

PyMethodDef oi_py_pb_functions[] = {
    {"get_input_tensor_by_name", (PyCFunction)(void (*)(void))pb_input_tensor_by_name, METH_VARARGS | METH_KEYWORDS,
     "pb_utils.get_input_tensor_by_name(inference_request, name): the request's input of that name, or None."},
    {NULL, NULL, 0, NULL},
};
