#include "python/onnx_module.h"

#include <stdlib.h>
#include <string.h>

#include "backends/onnx_backend.h"
#include "python/spec.h"

static PyObject *onnx_open(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL)
        return NULL;
    char err[1024];
    if (oi_onnx_open(path, err, sizeof(err)) != 0) {
        PyErr_SetString(PyExc_OSError, err);
        return NULL;
    }
    return Py_BuildValue("(sI)", oi_onnx_version(), oi_onnx_api_version());
}

static PyObject *onnx_providers(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    char *err = NULL;
    char *json = oi_onnx_providers(&err);
    return oi__py_json_str(json, err);
}

static PyObject *onnx_describe(PyObject *self, PyObject *spec);

PyMethodDef oi_py_onnx_functions[] = {
    {"onnx_open", onnx_open, METH_O, "Loads libonnxruntime (once); returns (version, api_version)."},
    {"onnx_describe", onnx_describe, METH_O, "(JSON of an ONNX model's inputs and outputs, its first session)."},
    {"onnx_providers", onnx_providers, METH_NOARGS, "JSON list of the loaded ONNX Runtime's providers."},
    {NULL, NULL, 0, NULL},
};

/* ---- add_model(onnx=...) ---------------------------------------------------------------- */

/* Accelerators from spec[key], a sequence of (name, ((key, value), ...)) whose strings stay
 * owned by `spec`. The arrays are new (free_accels); NULL with an exception on error. */
static oi_onnx_accel_t *parse_accels(PyObject *spec, const char *key, size_t *n)
{
    *n = 0;
    PyObject *v = PyDict_GetItemString(spec, key); /* borrowed */
    if (v == NULL)
        return calloc(1, sizeof(oi_onnx_accel_t));
    PyObject *fast = PySequence_Fast(v, "onnx spec: accelerators must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
    oi_onnx_accel_t *out = calloc((size_t)count + 1, sizeof(*out));
    if (out == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = NULL, *params = NULL;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "UO;an accelerator is (name, params)", &name, &params))
            goto fail;
        out[i].name = PyUnicode_AsUTF8(name);
        PyObject *pf = PySequence_Fast(params, "onnx spec: accelerator parameters must be a sequence");
        if (out[i].name == NULL || pf == NULL) {
            Py_XDECREF(pf);
            goto fail;
        }
        Py_ssize_t np = PySequence_Fast_GET_SIZE(pf);
        const char **keys = calloc((size_t)np + 1, sizeof(char *)), **values = calloc((size_t)np + 1, sizeof(char *));
        out[i].keys = keys;
        out[i].values = values;
        *n = (size_t)i + 1;
        if (keys == NULL || values == NULL) {
            Py_DECREF(pf);
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t k = 0; k < np; k++) {
            PyObject *pk = NULL, *pv = NULL;
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(pf, k), "UU;a parameter is (key, value)", &pk, &pv) ||
                (keys[k] = PyUnicode_AsUTF8(pk)) == NULL || (values[k] = PyUnicode_AsUTF8(pv)) == NULL) {
                Py_DECREF(pf);
                goto fail;
            }
            out[i].n = (size_t)k + 1;
        }
        Py_DECREF(pf);
    }
    Py_DECREF(fast);
    *n = (size_t)count;
    return out;
fail:
    for (size_t i = 0; i < *n; i++) {
        free((void *)out[i].keys);
        free((void *)out[i].values);
    }
    free(out);
    Py_DECREF(fast);
    *n = 0;
    return NULL;
}

/* spec[key]: a list of `n` reshapes (None or a sequence of ints) as a new array (free() it),
 * or NULL with an exception. */
static oi_io_spec_t *parse_reshapes(PyObject *spec, const char *key, uint32_t n)
{
    PyObject *v = PyDict_GetItemString(spec, key); /* borrowed */
    oi_io_spec_t *out = calloc(n + 1, sizeof(*out));
    if (out == NULL)
        return (oi_io_spec_t *)PyErr_NoMemory();
    for (uint32_t i = 0; i < n; i++)
        out[i].ndim = -1;
    if (v == NULL || v == Py_None)
        return out;
    PyObject *fast = PySequence_Fast(v, "onnx spec: reshapes must be a sequence");
    /* Tensors past the list (a sequence batcher's controls and states) are not reshaped. */
    Py_ssize_t given = fast != NULL ? PySequence_Fast_GET_SIZE(fast) : 0;
    if (given > (Py_ssize_t)n)
        PyErr_Format(PyExc_ValueError, "onnx spec: '%s' has %zd items for %u tensors", key, given, n);
    for (uint32_t i = 0; fast != NULL && !PyErr_Occurred() && i < (uint32_t)given; i++)
        oi__py_spec_reshape(PySequence_Fast_GET_ITEM(fast, i), "onnx spec", &out[i]);
    Py_XDECREF(fast);
    if (PyErr_Occurred()) {
        free(out);
        return NULL;
    }
    return out;
}

static void free_accels(oi_onnx_accel_t *a, size_t n)
{
    for (size_t i = 0; a && i < n; i++) {
        free((void *)a[i].keys);
        free((void *)a[i].values);
    }
    free(a);
}

/* An oi_onnx_spec_t read from a spec dict, and the arrays it owns (spec_free). Its strings
 * stay owned by the dict. */
typedef struct {
    oi_onnx_spec_t os;
    PyObject *devs; /* the devices as a fast sequence */
    int *devices;
    oi_onnx_accel_t *gpu, *cpu;
    size_t n_gpu, n_cpu;
    oi_io_spec_t *in_reshape, *out_reshape;
    Py_buffer *views; /* the external data's contents, held while the spec is used */
    const char **external_names;
    char **external_data;
    size_t *external_lengths;
    size_t n_external;
} parsed_spec_t;

static void spec_free(parsed_spec_t *p)
{
    for (size_t i = 0; i < p->n_external; i++)
        PyBuffer_Release(&p->views[i]);
    free(p->views);
    free(p->external_names);
    free(p->external_data);
    free(p->external_lengths);
    Py_XDECREF(p->devs);
    free(p->devices);
    free_accels(p->gpu, p->n_gpu);
    free_accels(p->cpu, p->n_cpu);
    free(p->in_reshape);
    free(p->out_reshape);
}

/* spec["external"] (absent: none), a sequence of (location, buffer) pairs, into p's external
 * arrays: the buffers are viewed, not copied. 0, or -1 with an exception. */
static int parse_external(PyObject *spec, parsed_spec_t *p)
{
    PyObject *v = PyDict_GetItemString(spec, "external"); /* borrowed */
    if (v == NULL)
        return 0;
    PyObject *fast = PySequence_Fast(v, "onnx spec: external must be a sequence of (location, buffer)");
    if (fast == NULL)
        return -1;
    size_t n = (size_t)PySequence_Fast_GET_SIZE(fast);
    p->views = calloc(n + 1, sizeof(*p->views));
    p->external_names = calloc(n + 1, sizeof(*p->external_names));
    p->external_data = calloc(n + 1, sizeof(*p->external_data));
    p->external_lengths = calloc(n + 1, sizeof(*p->external_lengths));
    if (!p->views || !p->external_names || !p->external_data || !p->external_lengths)
        PyErr_NoMemory();
    for (size_t i = 0; i < n && !PyErr_Occurred(); i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(fast, i);
        PyObject *name = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 ? PyTuple_GET_ITEM(pair, 0) : NULL;
        if (name == NULL || (p->external_names[i] = PyUnicode_AsUTF8(name)) == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "onnx spec: external items must be (str, buffer)");
            break;
        }
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(pair, 1), &p->views[i], PyBUF_SIMPLE) != 0)
            break;
        p->n_external = i + 1;
        /* ONNX Runtime's signature is not const, but it copies the data and never writes it. */
        p->external_data[i] = p->views[i].buf;
        p->external_lengths[i] = (size_t)p->views[i].len;
    }
    Py_DECREF(fast);
    return PyErr_Occurred() ? -1 : 0;
}

/* Reads `spec` into *p, with the reshapes of model `m` (NULL: none). 0, or -1 with an
 * exception (spec_free either way). */
static int spec_parse(PyObject *spec, const oi_model_t *m, parsed_spec_t *p)
{
    memset(p, 0, sizeof(*p));
    if (!PyDict_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "onnx spec must be a dict");
        return -1;
    }
    PyObject *path_o = PyDict_GetItemString(spec, "path");
    const char *path = path_o ? PyUnicode_AsUTF8(path_o) : NULL;
    PyObject *devs = PyDict_GetItemString(spec, "devices");
    p->devs = devs ? PySequence_Fast(devs, "onnx spec: devices must be a sequence of ints") : NULL;
    if (path == NULL || p->devs == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "onnx spec: needs 'path' and 'devices'");
        return -1;
    }
    Py_ssize_t n_dev = PySequence_Fast_GET_SIZE(p->devs);
    if (n_dev < 1) {
        PyErr_SetString(PyExc_ValueError, "onnx spec: at least one device");
        return -1;
    }
    if ((p->devices = calloc((size_t)n_dev, sizeof(int))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n_dev; i++)
        p->devices[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(p->devs, i));
    if (PyErr_Occurred() || (p->gpu = parse_accels(spec, "gpu_accelerators", &p->n_gpu)) == NULL ||
        (p->cpu = parse_accels(spec, "cpu_accelerators", &p->n_cpu)) == NULL || parse_external(spec, p) != 0 ||
        (m != NULL && ((p->in_reshape = parse_reshapes(spec, "input_reshape", m->n_inputs)) == NULL ||
                       (p->out_reshape = parse_reshapes(spec, "output_reshape", m->n_outputs)) == NULL)))
        return -1;
    p->os = (oi_onnx_spec_t){
        .path = path,
        .external_names = p->external_names,
        .external_data = p->external_data,
        .external_lengths = p->external_lengths,
        .n_external = p->n_external,
        .devices = p->devices,
        .instances = (int)n_dev,
        .intra_op_threads = oi__py_spec_int(spec, "intra_op_threads", 0),
        .inter_op_threads = oi__py_spec_int(spec, "inter_op_threads", 0),
        .graph_level = oi__py_spec_int(spec, "graph_level", 99),
        .execution_mode = oi__py_spec_int(spec, "execution_mode", 0),
        .gpu_accels = p->gpu,
        .n_gpu_accels = p->n_gpu,
        .cpu_accels = p->cpu,
        .n_cpu_accels = p->n_cpu,
        .input_reshape = p->in_reshape,
        .output_reshape = p->out_reshape,
    };
    return PyErr_Occurred() ? -1 : 0;
}

/* The capsule that carries the first instance's session from onnx_describe to add_model; its
 * context is set once add_model has taken the session. */
#define SESSION_CAPSULE "openinfer.onnx_session"

static void session_capsule_free(PyObject *capsule)
{
    if (PyCapsule_GetContext(capsule) == NULL)
        oi_onnx_session_release(PyCapsule_GetPointer(capsule, SESSION_CAPSULE));
}

static PyObject *onnx_describe(PyObject *self, PyObject *spec)
{
    (void)self;
    parsed_spec_t p;
    if (spec_parse(spec, NULL, &p) != 0) {
        spec_free(&p);
        return NULL;
    }
    char *err = NULL, *json;
    void *session = NULL;
    Py_BEGIN_ALLOW_THREADS
    json = oi_onnx_describe(&p.os, &session, &err);
    Py_END_ALLOW_THREADS
    spec_free(&p);
    PyObject *text = oi__py_json_str(json, err);
    PyObject *capsule = text ? PyCapsule_New(session, SESSION_CAPSULE, session_capsule_free) : NULL;
    if (capsule == NULL) {
        oi_onnx_session_release(session);
        Py_XDECREF(text);
        return NULL;
    }
    PyObject *r = PyTuple_Pack(2, text, capsule);
    Py_DECREF(text);
    Py_DECREF(capsule);
    return r;
}

void *oi_py_onnx_state(oi_model_t *m, PyObject *spec, char **load_error)
{
    *load_error = NULL;
    parsed_spec_t p;
    void *state = NULL;
    if (spec_parse(spec, m, &p) != 0)
        goto done;
    PyObject *capsule = PyDict_GetItemString(spec, "session"); /* borrowed */
    if (capsule != NULL && capsule != Py_None) {
        if (!PyCapsule_IsValid(capsule, SESSION_CAPSULE)) {
            PyErr_SetString(PyExc_TypeError, "onnx spec: 'session' must come from onnx_describe");
            goto done;
        }
        if (PyCapsule_GetContext(capsule) == NULL) { /* not yet taken by another add_model */
            p.os.session = PyCapsule_GetPointer(capsule, SESSION_CAPSULE);
            PyCapsule_SetContext(capsule, capsule);
        }
    }
    Py_BEGIN_ALLOW_THREADS
    state = oi_onnx_backend_state(m->name, &p.os, m->max_batch_size, m->inputs, m->n_inputs, m->outputs,
                                  m->n_outputs, load_error);
    Py_END_ALLOW_THREADS
    if (state == NULL && *load_error == NULL)
        PyErr_NoMemory();
done:
    spec_free(&p);
    return state;
}
