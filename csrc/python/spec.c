#include "python/spec.h"

#include <stdlib.h>
#include <string.h>

int oi__py_spec_int(PyObject *spec, const char *key, int dflt)
{
    PyObject *v = PyDict_GetItemString(spec, key); /* borrowed */
    return v == NULL || v == Py_None ? dflt : (int)PyLong_AsLong(v);
}

int oi__py_spec_reshape(PyObject *v, const char *what, oi_io_spec_t *out)
{
    memset(out, 0, sizeof(*out));
    out->ndim = -1;
    if (v == Py_None)
        return 0;
    PyObject *fast = PySequence_Check(v) ? PySequence_Fast(v, what) : NULL;
    if (fast == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s: a reshape is a sequence of ints or None", what);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > OI_MAX_DIMS) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: too many dimensions in a reshape", what);
        return -1;
    }
    out->ndim = (int)n;
    for (Py_ssize_t i = 0; i < n; i++)
        out->dims[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    Py_DECREF(fast);
    return PyErr_Occurred() ? -1 : 0;
}

PyObject *oi__py_json_str(char *json, char *err)
{
    if (json == NULL) {
        PyErr_SetString(PyExc_RuntimeError, err ? err : "out of memory");
        free(err);
        return NULL;
    }
    free(err);
    PyObject *r = PyUnicode_FromString(json);
    free(json);
    return r;
}
