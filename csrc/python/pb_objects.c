/* _core.TensorBase and _core.ResponseBase: the C halves of pb_utils.Tensor and
 * InferenceResponse (python/openinfer/_backends/triton_utils.py), the objects a Triton Python
 * model makes for each output and each response, and reads each input through. Their
 * construction and plain reads run for every request, so they are C here: a Python __init__
 * or method costs a frame each (add_sub: nine of them per request). The Python subclasses keep
 * everything else (datatype names, DLPack, repr, parameters). */
#include "python/pb_objects.h"

#include "python/numpy_api.h"

#include <structmember.h>

/* Both types are three object fields, read and written by Python as members. */
typedef struct {
    PyObject_HEAD PyObject *field[3];
} pb_object_t;

/* A Tensor's: str, numpy.ndarray (an input's read-only view, or the model's output), str (its V2
 * datatype). A response's: list of Tensor, TritonError or None, JSON text or None. */
enum { TENSOR_NAME, TENSOR_ARRAY, TENSOR_DATATYPE };
enum { RESPONSE_OUTPUTS, RESPONSE_ERROR, RESPONSE_PARAMETERS };

static int pb_object_traverse(PyObject *self, visitproc visit, void *arg)
{
    for (int i = 0; i < 3; i++) /* the subclass's traverse visits its type */
        Py_VISIT(((pb_object_t *)self)->field[i]);
    return 0;
}

static int pb_object_clear(PyObject *self)
{
    for (int i = 0; i < 3; i++)
        Py_CLEAR(((pb_object_t *)self)->field[i]);
    return 0;
}

/* Also the Python subclass's base dealloc: its subtype_dealloc drops the type's reference. */
static void pb_object_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    pb_object_clear(self);
    Py_TYPE(self)->tp_free(self);
}

/* Takes the references of a, b and c into the object's three fields. */
static void pb_object_set(PyObject *self, PyObject *a, PyObject *b, PyObject *c)
{
    pb_object_t *o = (pb_object_t *)self;
    Py_XSETREF(o->field[0], a);
    Py_XSETREF(o->field[1], b);
    Py_XSETREF(o->field[2], c);
}

/* A field read before it was set (a subclass that skipped __init__): AttributeError, as a slot. */
static PyObject *field(PyObject *self, int i, const char *what)
{
    PyObject *value = ((pb_object_t *)self)->field[i];
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
    return field(self, TENSOR_NAME, "name");
}

static PyObject *pb_tensor_as_numpy(PyObject *self, PyObject *unused)
{
    (void)unused;
    return field(self, TENSOR_ARRAY, "array");
}

static PyMethodDef pb_tensor_methods[] = {
    {"name", pb_tensor_name, METH_NOARGS, "The tensor's name."},
    {"as_numpy", pb_tensor_as_numpy, METH_NOARGS,
     "The tensor's values (an input: a read-only view of the request; BF16: uint16 bits)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef pb_tensor_members[] = {
    {"_name", T_OBJECT_EX, offsetof(pb_object_t, field[TENSOR_NAME]), 0, NULL},
    {"_array", T_OBJECT_EX, offsetof(pb_object_t, field[TENSOR_ARRAY]), 0, NULL},
    {"_datatype", T_OBJECT_EX, offsetof(pb_object_t, field[TENSOR_DATATYPE]), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject oi_py_pb_tensor_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "openinfer._core.TensorBase",
    .tp_basicsize = sizeof(pb_object_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = pb_tensor_init,
    .tp_dealloc = pb_object_dealloc,
    .tp_traverse = pb_object_traverse,
    .tp_clear = pb_object_clear,
    .tp_methods = pb_tensor_methods,
    .tp_members = pb_tensor_members,
    .tp_doc = "The C half of pb_utils.Tensor: its fields, construction, name() and as_numpy().",
};

/* InferenceResponse(output_tensors=None, error=None, parameters=None): the outputs copied into
 * a list of Tensors; an error or parameters go through the subclass's _checked(error,
 * parameters), which checks them and returns them as kept (parameters as JSON text). */
static int pb_response_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *keywords[] = {"output_tensors", "error", "parameters", NULL};
    PyObject *given = Py_None, *error = Py_None, *parameters = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOO:InferenceResponse", keywords, &given, &error, &parameters))
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
    return field(self, RESPONSE_OUTPUTS, "output tensors");
}

static PyObject *pb_response_error(PyObject *self, PyObject *unused)
{
    (void)unused;
    return field(self, RESPONSE_ERROR, "error");
}

static PyObject *pb_response_has_error(PyObject *self, PyObject *unused)
{
    (void)unused;
    PyObject *error = ((pb_object_t *)self)->field[RESPONSE_ERROR];
    return PyBool_FromLong(error != NULL && error != Py_None);
}

static PyMethodDef pb_response_methods[] = {
    {"output_tensors", pb_response_output_tensors, METH_NOARGS, "The response's output Tensors."},
    {"has_error", pb_response_has_error, METH_NOARGS, "Whether the response carries an error."},
    {"error", pb_response_error, METH_NOARGS, "The response's TritonError, or None."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef pb_response_members[] = {
    {"_outputs", T_OBJECT_EX, offsetof(pb_object_t, field[RESPONSE_OUTPUTS]), 0, NULL},
    {"_error", T_OBJECT_EX, offsetof(pb_object_t, field[RESPONSE_ERROR]), 0, NULL},
    {"_parameters", T_OBJECT_EX, offsetof(pb_object_t, field[RESPONSE_PARAMETERS]), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject oi_py_pb_response_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "openinfer._core.ResponseBase",
    .tp_basicsize = sizeof(pb_object_t),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = pb_response_init,
    .tp_dealloc = pb_object_dealloc,
    .tp_traverse = pb_object_traverse,
    .tp_clear = pb_object_clear,
    .tp_methods = pb_response_methods,
    .tp_members = pb_response_members,
    .tp_doc = "The C half of pb_utils.InferenceResponse: its fields, construction and plain reads.",
};
