#include "python/torch_module.h"

#include <stdlib.h>
#include <string.h>

#include "backends/torch_backend.h"
#include "python/spec.h"

static PyObject *torch_open_shim(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL)
        return NULL;
    char err[1024];
    if (oi_torch_shim_open(path, err, sizeof(err)) != 0) {
        PyErr_SetString(PyExc_OSError, err);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *torch_describe(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL)
        return NULL;
    char *err = NULL, *json;
    Py_BEGIN_ALLOW_THREADS
    json = oi_torch_describe(path, &err);
    Py_END_ALLOW_THREADS
    return oi__py_json_str(json, err);
}

/* torch_package_probe(path, device, [(datatype, shape), ...]) -> JSON text of the outputs. */
static PyObject *torch_package_probe(PyObject *self, PyObject *args)
{
    (void)self;
    const char *path, *device;
    PyObject *list;
    if (!PyArg_ParseTuple(args, "ssO", &path, &device, &list))
        return NULL;
    PyObject *fast = PySequence_Fast(list, "torch_package_probe: inputs must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    oits_input_t *in = calloc((size_t)n + 1, sizeof(*in));
    int64_t(*shapes)[OITS_MAX_DIMS] = calloc((size_t)n + 1, sizeof(*shapes));
    PyObject *result = NULL;
    if (in == NULL || shapes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *dtype;
        PyObject *shape;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "sO", &dtype, &shape))
            goto done;
        PyObject *dims = PySequence_Fast(shape, "torch_package_probe: a shape must be a sequence");
        if (dims == NULL)
            goto done;
        Py_ssize_t nd = PySequence_Fast_GET_SIZE(dims);
        in[i].dtype = oi_dtype_from_name(dtype, strlen(dtype));
        in[i].ndim = (int)nd;
        in[i].shape = shapes[i];
        for (Py_ssize_t d = 0; d < nd && d < OITS_MAX_DIMS; d++)
            shapes[i][d] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(dims, d));
        Py_DECREF(dims);
        if (PyErr_Occurred())
            goto done;
        if (in[i].dtype == OI_TYPE_INVALID || nd > OITS_MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "torch_package_probe: input %zd: bad datatype or rank", i);
            goto done;
        }
        for (Py_ssize_t d = 0; d < nd; d++)
            if (shapes[i][d] < 0) {
                PyErr_Format(PyExc_ValueError, "torch_package_probe: input %zd: negative dimension", i);
                goto done;
            }
    }
    char *err = NULL, *json;
    Py_BEGIN_ALLOW_THREADS
    json = oi_torch_package_probe(path, device, in, (size_t)n, &err);
    Py_END_ALLOW_THREADS
    result = oi__py_json_str(json, err);
done:
    free(in);
    free(shapes);
    Py_DECREF(fast);
    return result;
}

PyMethodDef oi_py_torch_functions[] = {
    {"torch_open_shim", torch_open_shim, METH_O, "Loads the libtorch shim (once; torch must be imported)."},
    {"torch_describe", torch_describe, METH_O, "JSON describing a TorchScript file's forward()."},
    {"torch_package_probe", torch_package_probe, METH_VARARGS,
     "Runs a PT2 package once on zero inputs: JSON of its outputs."},
    {NULL, NULL, 0, NULL},
};

/* ---- add_model(torch=...) --------------------------------------------------------------- */

/* A list from `spec[key]` as a new fast sequence of exactly `n` items, or NULL with an error. */
static PyObject *seq_item(PyObject *spec, const char *key, Py_ssize_t n)
{
    PyObject *v = PyDict_GetItemString(spec, key); /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "torch spec: missing '%s'", key);
        return NULL;
    }
    PyObject *fast = PySequence_Fast(v, "torch spec: expected a sequence");
    if (fast != NULL && n >= 0 && PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "torch spec: '%s' must have %zd items", key, n);
        Py_CLEAR(fast);
    }
    return fast;
}

void *oi_py_torch_state(oi_model_t *m, PyObject *spec, char **load_error)
{
    *load_error = NULL;
    if (!PyDict_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "torch spec must be a dict");
        return NULL;
    }
    void *state = NULL;
    PyObject *path_o = PyDict_GetItemString(spec, "path");
    const char *path = path_o ? PyUnicode_AsUTF8(path_o) : NULL;
    if (path == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "torch spec: missing 'path'");
        return NULL;
    }
    PyObject *devs = seq_item(spec, "devices", -1), *args = seq_item(spec, "arg_inputs", -1);
    PyObject *oidx = seq_item(spec, "output_index", m->n_outputs), *okey = seq_item(spec, "output_key", m->n_outputs);
    PyObject *ires = seq_item(spec, "input_reshape", m->n_inputs), *ores = seq_item(spec, "output_reshape", m->n_outputs);
    Py_ssize_t n_dev = devs ? PySequence_Fast_GET_SIZE(devs) : 0, n_args = args ? PySequence_Fast_GET_SIZE(args) : 0;
    const char **devices = calloc((size_t)n_dev + 1, sizeof(char *));
    uint32_t *arg_inputs = calloc((size_t)n_args + 1, sizeof(uint32_t));
    int *output_index = calloc(m->n_outputs + 1, sizeof(int));
    const char **output_key = calloc(m->n_outputs + 1, sizeof(char *));
    oi_io_spec_t *input_reshape = calloc(m->n_inputs + 1, sizeof(oi_io_spec_t));
    oi_io_spec_t *output_reshape = calloc(m->n_outputs + 1, sizeof(oi_io_spec_t));
    int32_t *dim_links = NULL;
    if (devs == NULL || args == NULL || oidx == NULL || okey == NULL || ires == NULL || ores == NULL)
        goto done;
    if (!devices || !arg_inputs || !output_index || !output_key || !input_reshape || !output_reshape) {
        PyErr_NoMemory();
        goto done;
    }
    if (n_dev < 1) {
        PyErr_SetString(PyExc_ValueError, "torch spec: at least one device");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n_dev; i++)
        if ((devices[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(devs, i))) == NULL)
            goto done;
    for (Py_ssize_t i = 0; i < n_args; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(args, i));
        if (v < 0 || (uint32_t)v >= m->n_inputs) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "torch spec: argument %zd maps to input %ld of %u", i, v, m->n_inputs);
            goto done;
        }
        arg_inputs[i] = (uint32_t)v;
    }
    for (uint32_t i = 0; i < m->n_outputs; i++) {
        output_index[i] = (int)PyLong_AsLong(PySequence_Fast_GET_ITEM(oidx, i));
        PyObject *k = PySequence_Fast_GET_ITEM(okey, i);
        if (PyErr_Occurred() || (k != Py_None && (output_key[i] = PyUnicode_AsUTF8(k)) == NULL) ||
            oi__py_spec_reshape(PySequence_Fast_GET_ITEM(ores, i), "torch spec", &output_reshape[i]) != 0)
            goto done;
    }
    for (uint32_t i = 0; i < m->n_inputs; i++)
        if (oi__py_spec_reshape(PySequence_Fast_GET_ITEM(ires, i), "torch spec", &input_reshape[i]) != 0)
            goto done;
    oi_torch_spec_t ts = {
        .path = path,
        .package = oi__py_spec_int(spec, "package", 0),
        .devices = devices,
        .instances = (int)n_dev,
        .options = {.inference_mode = oi__py_spec_int(spec, "inference_mode", 1),
                    .disable_optimized = oi__py_spec_int(spec, "disable_optimized_execution", 0),
                    .intra_op_threads = oi__py_spec_int(spec, "intra_op_threads", 0),
                    .inter_op_threads = oi__py_spec_int(spec, "inter_op_threads", 0)},
        .arg_inputs = arg_inputs,
        .n_args = (uint32_t)n_args,
        .output_index = output_index,
        .output_key = output_key,
        .input_reshape = input_reshape,
        .output_reshape = output_reshape,
    };
    PyObject *links = PyDict_GetItemString(spec, "dim_links"); /* borrowed; optional */
    PyObject *lfast = links ? PySequence_Fast(links, "torch spec: dim_links must be a sequence") : NULL;
    Py_ssize_t n_links = lfast ? PySequence_Fast_GET_SIZE(lfast) : 0;
    dim_links = calloc((size_t)n_links * 4 + 1, sizeof(int32_t));
    if (dim_links == NULL)
        PyErr_NoMemory();
    for (Py_ssize_t i = 0; dim_links && i < n_links && !PyErr_Occurred(); i++) {
        PyObject *quad = PySequence_Fast(PySequence_Fast_GET_ITEM(lfast, i), "torch spec: a dim link is a sequence");
        if (quad != NULL && PySequence_Fast_GET_SIZE(quad) != 4)
            PyErr_SetString(PyExc_ValueError, "torch spec: a dim link has 4 items");
        for (int k = 0; quad != NULL && k < 4 && !PyErr_Occurred(); k++)
            dim_links[i * 4 + k] = (int32_t)PyLong_AsLong(PySequence_Fast_GET_ITEM(quad, k));
        Py_XDECREF(quad);
    }
    Py_XDECREF(lfast);
    ts.dim_links = dim_links;
    ts.n_dim_links = (uint32_t)n_links;
    if (PyErr_Occurred())
        goto done;
    Py_BEGIN_ALLOW_THREADS
    state = oi_torch_backend_state(m->name, &ts, m->max_batch_size, m->inputs, m->n_inputs, m->outputs, m->n_outputs,
                                   load_error);
    Py_END_ALLOW_THREADS
    if (state == NULL && *load_error == NULL)
        PyErr_NoMemory();
done:
    free(devices);
    free(arg_inputs);
    free(output_index);
    free(output_key);
    free(input_reshape);
    free(output_reshape);
    free(dim_links);
    Py_XDECREF(devs);
    Py_XDECREF(args);
    Py_XDECREF(oidx);
    Py_XDECREF(okey);
    Py_XDECREF(ires);
    Py_XDECREF(ores);
    return state;
}
