/* _core.HttpConnection: one keep-alive connection of the Python Client. Inference requests
 * are encoded, sent and decoded here without the GIL; input arrays leave from their own
 * memory and output arrays view the received body. */
#include "python/client.h"

#include "client/http_client.h"
#include "client/socket.h"
#include "codec/json.h"
#include "python/bridge.h"

typedef struct {
    PyObject_HEAD
    oi_http_client_t *conn;
    PyThread_type_lock lock; /* one call at a time: a connection is a byte stream */
} ConnObject;

int oi__py_conn_args(PyObject *args, PyObject *kw, const char **host, int *port, oi_ctls_config_t *tls,
                     int *has_tls)
{
    static char *kwlist[] = {"host", "port", "tls", NULL};
    PyObject *spec = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "si|$O", kwlist, host, port, &spec))
        return -1;
    *has_tls = spec != Py_None;
    *tls = (oi_ctls_config_t){0};
    if (*has_tls && !PyArg_ParseTuple(spec, "zzzp", &tls->ca_file, &tls->cert_file, &tls->key_file, &tls->verify)) {
        PyErr_SetString(PyExc_ValueError, "tls must be (ca_file, cert_file, key_file, verify), files or None");
        return -1;
    }
    if (*has_tls && (*host)[0] == '/') {
        PyErr_SetString(PyExc_ValueError, "TLS is for TCP connections, not a Unix socket");
        return -1;
    }
    if ((*host)[0] == '/') /* a Unix socket's path: no port */
        return 0;
    if (*port <= 0 || *port > 65535) {
        PyErr_Format(PyExc_ValueError, "port must be 1 to 65535, got %d", *port);
        return -1;
    }
    return 0;
}

int oi__py_conn_acquire(PyThread_type_lock lock, int open)
{
    if (!open) {
        PyErr_SetString(PyExc_RuntimeError, "the connection is closed");
        return -1;
    }
    if (!PyThread_acquire_lock(lock, NOWAIT_LOCK)) {
        PyErr_SetString(PyExc_RuntimeError, "this connection is in use by another thread");
        return -1;
    }
    return 0;
}

static int Conn_init(ConnObject *self, PyObject *args, PyObject *kw)
{
    const char *host;
    int port, has_tls;
    oi_ctls_config_t tls;
    if (oi__py_conn_args(args, kw, &host, &port, &tls, &has_tls) != 0)
        return -1;
    if (self->conn != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "already initialized");
        return -1;
    }
    self->conn = oi_http_client_new(host, port);
    self->lock = PyThread_allocate_lock();
    if (self->conn == NULL || self->lock == NULL || (has_tls && oi_http_client_set_tls(self->conn, &tls) != 0)) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void Conn_dealloc(ConnObject *self)
{
    oi_http_client_free(self->conn);
    if (self->lock)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

int64_t oi__py_timeout_ms(PyObject *timeout)
{
    if (timeout == NULL || timeout == Py_None)
        return 0;
    double t = PyFloat_AsDouble(timeout);
    if (t == -1.0 && PyErr_Occurred())
        return -1;
    if (t <= 0) {
        PyErr_SetString(PyExc_ValueError, "timeout must be positive or None");
        return -1;
    }
    return t * 1000.0 < 1 ? 1 : (int64_t)(t * 1000.0);
}

static int acquire(ConnObject *self) { return oi__py_conn_acquire(self->lock, self->conn != NULL); }

/* The interrupt check of oi__py_io_begin: runs with the GIL taken back for the moment. */
static int io_check_signals(void *arg)
{
    oi_py_io_t *io = arg;
    PyEval_RestoreThread(io->ts);
    if (PyErr_CheckSignals() != 0)
        io->raised = 1;
    io->ts = PyEval_SaveThread();
    return io->raised;
}

void oi__py_io_begin(oi_py_io_t *io)
{
    io->raised = 0;
    io->ts = PyEval_SaveThread();
    oi_client_set_interrupt(io_check_signals, io);
}

void oi__py_io_end(oi_py_io_t *io)
{
    oi_client_set_interrupt(NULL, NULL);
    PyEval_RestoreThread(io->ts);
}

/* Sends one request without the GIL. Returns 0 with *resp filled, or -1 with OSError or
 * TimeoutError set. */
static int send_request(ConnObject *self, const char *method, const char *path, const char *headers,
                        const struct iovec *parts, int nparts, int64_t tmo, oi_http_client_response_t *resp)
{
    char err[512];
    int rc;
    oi_py_io_t io;
    oi__py_io_begin(&io);
    rc = oi_http_client_request(self->conn, method, path, headers, parts, nparts, tmo, resp, err, sizeof(err));
    oi__py_io_end(&io);
    if (io.raised) { /* KeyboardInterrupt (say) is set; the connection is closed */
        if (rc == 0)
            oi_buf_unref(resp->body);
        return -1;
    }
    if (rc == -2)
        PyErr_SetString(PyExc_TimeoutError, err);
    else if (rc != 0)
        PyErr_SetString(PyExc_ConnectionError, err);
    return rc == 0 ? 0 : -1;
}

static PyObject *body_bytes(const oi_http_client_response_t *r)
{
    return PyBytes_FromStringAndSize(r->body ? r->body->data : "", r->body ? (Py_ssize_t)r->body->len : 0);
}

static PyObject *Conn_request(ConnObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"method", "path", "body", "headers", "timeout", NULL};
    const char *method, *path, *headers = NULL;
    Py_buffer body = {0};
    PyObject *timeout = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|z*zO", kwlist, &method, &path, &body, &headers, &timeout))
        return NULL;
    int64_t tmo = oi__py_timeout_ms(timeout);
    PyObject *ret = NULL;
    if (tmo >= 0 && acquire(self) == 0) {
        struct iovec part = {body.buf, body.buf ? (size_t)body.len : 0};
        oi_http_client_response_t resp;
        if (send_request(self, method, path, headers, &part, body.buf ? 1 : 0, tmo, &resp) == 0) {
            PyObject *b = body_bytes(&resp);
            ret = b ? Py_BuildValue("(iN)", resp.status, b) : NULL;
            oi_buf_unref(resp.body);
        }
        PyThread_release_lock(self->lock);
    }
    PyBuffer_Release(&body);
    return ret;
}

int oi__py_collect_inputs(PyObject *seq, oi_tensor_t **out, uint32_t *n)
{
    PyObject *fast = PySequence_Fast(seq, "inputs must be a sequence of (name, datatype, array)");
    if (fast == NULL)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(fast);
    *out = calloc(count ? (size_t)count : 1, sizeof(oi_tensor_t));
    *n = 0;
    if (*out == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *name, *dtype;
        PyObject *value;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "ssO", &name, &dtype, &value))
            goto fail;
        oi_dtype_t t = oi_dtype_from_name(dtype, strlen(dtype));
        if (t == OI_TYPE_INVALID) {
            PyErr_Format(PyExc_ValueError, "input '%s': unknown datatype '%s'", name, dtype);
            goto fail;
        }
        oi_status_t *st = oi_py_to_tensor(value, t, "input", name, &(*out)[i]);
        if (st != NULL) {
            PyErr_SetString(PyExc_ValueError, st->message);
            oi_status_free(st);
            goto fail;
        }
        (*out)[i].name = name; /* borrowed from the caller's tuple, alive for the call */
        (*n)++;
    }
    Py_DECREF(fast);
    return 0;
fail:
    Py_DECREF(fast);
    return -1;
}

PyObject *oi__py_infer_result(const oi_request_t *result, const char *model_name, const char *model_version)
{
    PyObject *outputs = PyDict_New(), *types = PyDict_New();
    /* Binary outputs all view the one body: one base object for all of them. */
    PyObject *body = result->body ? oi_py_owner_capsule(result->body) : NULL;
    for (uint32_t i = 0; outputs != NULL && types != NULL && i < result->n_inputs; i++) {
        const oi_tensor_t *t = &result->inputs[i];
        PyObject *arr = oi_py_array_view_base(t, 1, body && t->owner == result->body ? body : NULL);
        PyObject *dt = PyUnicode_FromString(oi_dtype_name(t->dtype));
        if (arr == NULL || dt == NULL || PyDict_SetItemString(outputs, t->name, arr) != 0 ||
            PyDict_SetItemString(types, t->name, dt) != 0)
            Py_CLEAR(outputs);
        Py_XDECREF(arr);
        Py_XDECREF(dt);
    }
    Py_XDECREF(body);
    if (outputs == NULL || types == NULL) {
        Py_XDECREF(outputs);
        Py_XDECREF(types);
        return NULL;
    }
    return Py_BuildValue("(zzzNN)", model_name, model_version, result->id, outputs, types);
}

static PyObject *Conn_infer(ConnObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "inputs", "outputs", "request_id", "parameters", "timeout", NULL};
    const char *path, *request_id = NULL;
    PyObject *inputs, *outputs = Py_None, *timeout = NULL;
    Py_buffer params = {0};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|Ozz*O", kwlist, &path, &inputs, &outputs, &request_id, &params,
                                     &timeout))
        return NULL;
    oi_tensor_t *tensors = NULL;
    uint32_t n_in = 0, n_out = 0;
    const char **out_names = NULL;
    PyObject *out_fast = NULL, *ret = NULL;
    struct iovec *iov = NULL;
    oi_sbuf_t json = {0};
    int64_t tmo = oi__py_timeout_ms(timeout);
    if (tmo < 0 || oi__py_collect_inputs(inputs, &tensors, &n_in) != 0)
        goto done;
    if (outputs != Py_None) {
        out_fast = PySequence_Fast(outputs, "outputs must be a sequence of names");
        if (out_fast == NULL)
            goto done;
        n_out = (uint32_t)PySequence_Fast_GET_SIZE(out_fast);
        out_names = calloc(n_out ? n_out : 1, sizeof(char *));
        if (out_names == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (uint32_t i = 0; i < n_out; i++)
            if ((out_names[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(out_fast, i))) == NULL)
                goto done;
    }
    oi_slice_t pslice = {params.buf, params.buf ? (size_t)params.len : 0};
    iov = calloc(n_in + 1, sizeof(*iov));
    if (iov == NULL || oi_json_encode_infer_request(&json, tensors, n_in, out_names, n_out, request_id, pslice) != 0) {
        PyErr_NoMemory();
        goto done;
    }
    iov[0] = (struct iovec){json.data, json.len};
    for (uint32_t i = 0; i < n_in; i++)
        iov[i + 1] = (struct iovec){tensors[i].data, tensors[i].byte_size};
    char headers[96];
    snprintf(headers, sizeof(headers), "Inference-Header-Content-Length: %zu\r\n", json.len);
    if (acquire(self) != 0)
        goto done;
    oi_http_client_response_t resp;
    int rc = send_request(self, "POST", path, headers, iov, (int)n_in + 1, tmo, &resp);
    PyThread_release_lock(self->lock);
    if (rc != 0)
        goto done;
    if (resp.status != 200 || resp.body == NULL) {
        PyObject *b = body_bytes(&resp);
        ret = b ? Py_BuildValue("(iN)", resp.status, b) : NULL;
        oi_buf_unref(resp.body);
        goto done;
    }
    oi_json_response_t decoded;
    oi_status_t *st;
    size_t json_len = resp.inference_header_length >= 0 ? (size_t)resp.inference_header_length : resp.body->len;
    Py_BEGIN_ALLOW_THREADS
    st = oi_json_decode_infer_response(resp.body, json_len, &decoded, NULL);
    Py_END_ALLOW_THREADS
    oi_buf_unref(resp.body); /* the decoded tensors hold their own references */
    if (st != NULL) {
        PyErr_Format(PyExc_ValueError, "malformed inference response: %s", st->message);
        oi_status_free(st);
        goto done;
    }
    PyObject *result = oi__py_infer_result(&decoded.result, decoded.model_name, decoded.model_version);
    oi_request_clear(&decoded.result);
    ret = result ? Py_BuildValue("(iN)", 200, result) : NULL;
done:
    for (uint32_t i = 0; i < n_in; i++)
        oi_tensor_clear(&tensors[i]);
    free(tensors);
    free(out_names);
    free(iov);
    oi_sbuf_free(&json);
    Py_XDECREF(out_fast);
    PyBuffer_Release(&params);
    return ret;
}

static PyObject *Conn_close(ConnObject *self, PyObject *noargs)
{
    (void)noargs;
    if (self->conn != NULL && PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        oi_http_client_free(self->conn);
        self->conn = NULL;
        PyThread_release_lock(self->lock);
    }
    Py_RETURN_NONE;
}

static PyMethodDef Conn_methods[] = {
    {"request", (PyCFunction)(void (*)(void))Conn_request, METH_VARARGS | METH_KEYWORDS,
     "request(method, path, body=None, headers=None, timeout=None) -> (status, body)"},
    {"infer", (PyCFunction)(void (*)(void))Conn_infer, METH_VARARGS | METH_KEYWORDS,
     "infer(path, inputs, outputs=None, request_id=None, parameters=None, timeout=None) -> (status, result)"},
    {"close", (PyCFunction)Conn_close, METH_NOARGS, "Closes the connection."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject oi_py_conn_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "openinfer._core.HttpConnection",
    .tp_basicsize = sizeof(ConnObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A keep-alive HTTP/1.1 connection to a V2 server.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Conn_init,
    .tp_dealloc = (destructor)Conn_dealloc,
    .tp_methods = Conn_methods,
};
