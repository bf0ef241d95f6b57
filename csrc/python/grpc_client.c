/* _core.GrpcConnection: one gRPC connection of the Python Client, the twin of HttpConnection,
 * and _core.GrpcStream, one ModelStreamInfer call on it. Requests are encoded, sent, received
 * and decoded here without the GIL: input arrays leave from their own memory as
 * raw_input_contents, and output arrays view the received message. Health and metadata use
 * protobuf-c and come back shaped like the HTTP API's JSON.
 *
 * Each method returns (grpc_status, value): the value on OK, else the grpc-message; the Python
 * Client maps statuses to InferenceServerError. Connection failures raise ConnectionError and
 * deadlines TimeoutError. */
#include "python/client.h"

#include "grpc_service.pb-c.h"

#include "client/grpc_client.h"
#include "codec/pb_infer.h"
#include "python/bridge.h"
#include "transport/grpc.h"

#define SERVICE "/inference.GRPCInferenceService/"

typedef struct {
    PyObject_HEAD
    oi_grpc_client_t *conn;
    PyThread_type_lock lock; /* one call at a time: a connection is driven by one thread */
    int streams;             /* GrpcStream objects still holding a call on `conn` */
    int closed;              /* close() was called: `conn` goes with the last stream */
} ConnObject;

typedef struct {
    PyObject_HEAD
    ConnObject *conn; /* a strong reference: the connection outlives the stream */
    oi_grpc_client_call_t *call;
    /* The fields every request of the stream shares. */
    PyObject *model, *version, *outputs, *parameters;
} StreamObject;

static PyObject *conn_error(int rc, const char *err)
{
    PyErr_SetString(rc == OI_GRPC_CLIENT_TIMEOUT ? PyExc_TimeoutError : PyExc_ConnectionError, err);
    return NULL;
}

static int conn_acquire(ConnObject *self)
{
    return oi__py_conn_acquire(self->lock, self->conn != NULL && !self->closed);
}

static PyObject *message_str(const char *m)
{
    return PyUnicode_DecodeUTF8(m ? m : "", m ? (Py_ssize_t)strlen(m) : 0, "replace");
}

/* ---- the connection ------------------------------------------------------------------------ */

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
    self->conn = oi_grpc_client_new(host, port);
    self->lock = PyThread_allocate_lock();
    if (self->conn == NULL || self->lock == NULL || (has_tls && oi_grpc_client_set_tls(self->conn, &tls) != 0)) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void Conn_dealloc(ConnObject *self)
{
    oi_grpc_client_free(self->conn); /* streams hold a reference: none is left */
    if (self->lock)
        PyThread_free_lock(self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* One unary call of `method` with a protobuf-c request, without the GIL. Returns 0 with
 * *status, *resp (OK only) and *message (a new string or NULL), or -1 with a Python error. */
static int unary(ConnObject *self, const char *method, const ProtobufCMessage *req, PyObject *timeout, oi_buf_t **resp,
                 int *status, char **message)
{
    int64_t tmo = oi__py_timeout_ms(timeout);
    if (tmo < 0)
        return -1;
    uint8_t small[512];
    size_t n = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = n <= sizeof(small) ? small : malloc(n);
    if (buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    struct iovec part = {buf, protobuf_c_message_pack(req, buf)};
    char err[512];
    int rc = -1;
    if (conn_acquire(self) == 0) {
        oi_py_io_t io;
        oi__py_io_begin(&io);
        rc = oi_grpc_client_unary(self->conn, method, &part, 1, tmo, resp, status, message, err, sizeof(err));
        oi__py_io_end(&io);
        PyThread_release_lock(self->lock);
        if (io.raised && rc == 0) { /* the exception stands */
            oi_buf_unref(*resp);
            free(*message);
            rc = -1;
        } else if (rc != 0 && !io.raised) {
            conn_error(rc, err);
        }
    }
    if (buf != small)
        free(buf);
    return rc == 0 ? 0 : -1;
}

/* (status, message) for a failed call; takes `message`. */
static PyObject *failed(int status, char *message)
{
    PyObject *m = message_str(message);
    free(message);
    return m ? Py_BuildValue("(iN)", status, m) : NULL;
}

/* Unpacks a response message without the GIL; NULL with a Python error when malformed. */
static ProtobufCMessage *unpack(const ProtobufCMessageDescriptor *d, oi_buf_t *msg)
{
    ProtobufCMessage *m;
    Py_BEGIN_ALLOW_THREADS
    m = protobuf_c_message_unpack(d, NULL, msg->len, (const uint8_t *)msg->data);
    Py_END_ALLOW_THREADS
    oi_buf_unref(msg);
    if (m == NULL)
        PyErr_Format(PyExc_ValueError, "malformed %s from the server", d->name);
    return m;
}

/* The three health RPCs: a boolean answer in field 1 of each response. */
static PyObject *health(ConnObject *self, const char *method, const ProtobufCMessage *req,
                        const ProtobufCMessageDescriptor *resp_desc, PyObject *timeout)
{
    oi_buf_t *resp;
    int status;
    char *message;
    if (unary(self, method, req, timeout, &resp, &status, &message) != 0)
        return NULL;
    if (status != OI_GRPC_OK)
        return failed(status, message);
    free(message);
    ProtobufCMessage *m = unpack(resp_desc, resp);
    if (m == NULL)
        return NULL;
    /* ServerLiveResponse.live, ServerReadyResponse.ready and ModelReadyResponse.ready share
     * one layout: the base, then a protobuf_c_boolean. */
    int value = ((Inference__ServerLiveResponse *)m)->live;
    protobuf_c_message_free_unpacked(m, NULL);
    return Py_BuildValue("(iO)", 0, value ? Py_True : Py_False);
}

static PyObject *Conn_server_live(ConnObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    PyObject *timeout = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &timeout))
        return NULL;
    Inference__ServerLiveRequest req = INFERENCE__SERVER_LIVE_REQUEST__INIT;
    return health(self, SERVICE "ServerLive", &req.base, &inference__server_live_response__descriptor, timeout);
}

static PyObject *Conn_server_ready(ConnObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    PyObject *timeout = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &timeout))
        return NULL;
    Inference__ServerReadyRequest req = INFERENCE__SERVER_READY_REQUEST__INIT;
    return health(self, SERVICE "ServerReady", &req.base, &inference__server_ready_response__descriptor, timeout);
}

static PyObject *Conn_model_ready(ConnObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "version", "timeout", NULL};
    char *name, *version = NULL;
    PyObject *timeout = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|zO", kwlist, &name, &version, &timeout))
        return NULL;
    Inference__ModelReadyRequest req = INFERENCE__MODEL_READY_REQUEST__INIT;
    req.name = name;
    req.version = version ? version : "";
    return health(self, SERVICE "ModelReady", &req.base, &inference__model_ready_response__descriptor, timeout);
}

static PyObject *str_list(char **v, size_t n)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l != NULL && i < n; i++) {
        PyObject *s = message_str(v[i]);
        if (s == NULL)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, (Py_ssize_t)i, s);
    }
    return l;
}

static PyObject *Conn_server_metadata(ConnObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"timeout", NULL};
    PyObject *timeout = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", kwlist, &timeout))
        return NULL;
    Inference__ServerMetadataRequest req = INFERENCE__SERVER_METADATA_REQUEST__INIT;
    oi_buf_t *resp;
    int status;
    char *message;
    if (unary(self, SERVICE "ServerMetadata", &req.base, timeout, &resp, &status, &message) != 0)
        return NULL;
    if (status != OI_GRPC_OK)
        return failed(status, message);
    free(message);
    Inference__ServerMetadataResponse *m =
        (Inference__ServerMetadataResponse *)unpack(&inference__server_metadata_response__descriptor, resp);
    if (m == NULL)
        return NULL;
    /* The keys of GET /v2. */
    PyObject *d = Py_BuildValue("{s:N,s:N,s:N}", "name", message_str(m->name), "version", message_str(m->version),
                                "extensions", str_list(m->extensions, m->n_extensions));
    protobuf_c_message_free_unpacked(&m->base, NULL);
    return d ? Py_BuildValue("(iN)", 0, d) : NULL;
}

static PyObject *tensor_list(Inference__ModelMetadataResponse__TensorMetadata **v, size_t n)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l != NULL && i < n; i++) {
        PyObject *shape = PyList_New((Py_ssize_t)v[i]->n_shape);
        for (size_t k = 0; shape != NULL && k < v[i]->n_shape; k++) {
            PyObject *dim = PyLong_FromLongLong(v[i]->shape[k]);
            if (dim == NULL)
                Py_CLEAR(shape);
            else
                PyList_SET_ITEM(shape, (Py_ssize_t)k, dim);
        }
        PyObject *t = shape ? Py_BuildValue("{s:N,s:N,s:N}", "name", message_str(v[i]->name), "datatype",
                                            message_str(v[i]->datatype), "shape", shape)
                            : NULL;
        if (t == NULL)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, (Py_ssize_t)i, t);
    }
    return l;
}

static PyObject *Conn_model_metadata(ConnObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"name", "version", "timeout", NULL};
    char *name, *version = NULL;
    PyObject *timeout = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|zO", kwlist, &name, &version, &timeout))
        return NULL;
    Inference__ModelMetadataRequest req = INFERENCE__MODEL_METADATA_REQUEST__INIT;
    req.name = name;
    req.version = version ? version : "";
    oi_buf_t *resp;
    int status;
    char *message;
    if (unary(self, SERVICE "ModelMetadata", &req.base, timeout, &resp, &status, &message) != 0)
        return NULL;
    if (status != OI_GRPC_OK)
        return failed(status, message);
    free(message);
    Inference__ModelMetadataResponse *m =
        (Inference__ModelMetadataResponse *)unpack(&inference__model_metadata_response__descriptor, resp);
    if (m == NULL)
        return NULL;
    /* The keys of GET /v2/models/<name>, in its order. */
    PyObject *d = Py_BuildValue("{s:N,s:N,s:N,s:N,s:N}", "name", message_str(m->name), "versions",
                                str_list(m->versions, m->n_versions), "platform", message_str(m->platform), "inputs",
                                tensor_list(m->inputs, m->n_inputs), "outputs", tensor_list(m->outputs, m->n_outputs));
    protobuf_c_message_free_unpacked(&m->base, NULL);
    return d ? Py_BuildValue("(iN)", 0, d) : NULL;
}

/* Any unary RPC with a request message given as bytes: for the RPCs without a method here (and
 * for tests). */
static PyObject *Conn_unary(ConnObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"method", "body", "timeout", NULL};
    const char *method;
    Py_buffer body = {0};
    PyObject *timeout = NULL, *ret = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|y*O", kwlist, &method, &body, &timeout))
        return NULL;
    int64_t tmo = oi__py_timeout_ms(timeout);
    if (tmo >= 0 && conn_acquire(self) == 0) {
        struct iovec part = {body.buf, body.buf ? (size_t)body.len : 0};
        oi_buf_t *resp = NULL;
        int status = 0, rc;
        char *message = NULL, err[512];
        oi_py_io_t io;
        oi__py_io_begin(&io);
        rc = oi_grpc_client_unary(self->conn, method, &part, 1, tmo, &resp, &status, &message, err, sizeof(err));
        oi__py_io_end(&io);
        PyThread_release_lock(self->lock);
        if (io.raised) { /* the exception stands */
            if (rc == 0) {
                oi_buf_unref(resp);
                free(message);
            }
        } else if (rc != 0) {
            conn_error(rc, err);
        } else if (status != OI_GRPC_OK) {
            ret = failed(status, message);
        } else {
            free(message);
            PyObject *b = PyBytes_FromStringAndSize(resp->data, (Py_ssize_t)resp->len);
            oi_buf_unref(resp);
            ret = b ? Py_BuildValue("(iN)", 0, b) : NULL;
        }
    }
    PyBuffer_Release(&body);
    return ret;
}

/* ---- inference ------------------------------------------------------------------------------ */

/* The parts of a ModelInferRequest that Python objects give; every pointer borrows from them
 * (the caller keeps them alive for the call). */
typedef struct {
    oi_pb_request_head_t head;
    oi_pb_param_t *params;
    const char **outputs;
    PyObject *out_fast;
} head_t;

static void head_clear(head_t *h)
{
    free(h->params);
    free(h->outputs);
    Py_XDECREF(h->out_fast);
    memset(h, 0, sizeof(*h));
}

/* Parameters: a dict of str -> bool | int | float | str | bytes, as InferParameter values. */
static int collect_params(PyObject *dict, head_t *h)
{
    if (dict == NULL || dict == Py_None)
        return 0;
    if (!PyDict_Check(dict)) {
        PyErr_SetString(PyExc_TypeError, "parameters must be a dict");
        return -1;
    }
    Py_ssize_t n = PyDict_Size(dict), pos = 0, i = 0;
    h->params = calloc(n ? (size_t)n : 1, sizeof(oi_pb_param_t));
    if (h->params == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *k, *v;
    while (PyDict_Next(dict, &pos, &k, &v)) {
        oi_pb_param_t *p = &h->params[i++];
        if (!PyUnicode_Check(k) || (p->key = PyUnicode_AsUTF8(k)) == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "parameter names must be str");
            return -1;
        }
        if (PyBool_Check(v)) {
            p->type = OI_PB_PARAM_BOOL;
            p->b = v == Py_True;
        } else if (PyLong_Check(v)) {
            int overflow;
            p->type = OI_PB_PARAM_INT64;
            p->i = PyLong_AsLongLongAndOverflow(v, &overflow);
            if (overflow > 0) { /* above int64: uint64_param, as tritonclient does */
                p->type = OI_PB_PARAM_UINT64;
                p->u = PyLong_AsUnsignedLongLong(v);
            }
            if (overflow < 0 || PyErr_Occurred()) {
                PyErr_Clear();
                PyErr_Format(PyExc_OverflowError, "parameter '%s' does not fit a 64-bit integer", p->key);
                return -1;
            }
        } else if (PyFloat_Check(v)) {
            p->type = OI_PB_PARAM_DOUBLE;
            p->d = PyFloat_AS_DOUBLE(v);
        } else if (PyUnicode_Check(v)) {
            Py_ssize_t len;
            p->type = OI_PB_PARAM_STRING;
            if ((p->s = PyUnicode_AsUTF8AndSize(v, &len)) == NULL)
                return -1;
            p->s_len = (size_t)len;
        } else if (PyBytes_Check(v)) {
            p->type = OI_PB_PARAM_STRING;
            p->s = PyBytes_AS_STRING(v);
            p->s_len = (size_t)PyBytes_GET_SIZE(v);
        } else {
            PyErr_Format(PyExc_TypeError, "parameter '%s': expected bool, int, float or str, got %s", p->key,
                         Py_TYPE(v)->tp_name);
            return -1;
        }
    }
    h->head.params = h->params;
    h->head.n_params = (size_t)i;
    return 0;
}

static int make_head(head_t *h, const char *model, const char *version, const char *id, PyObject *outputs,
                     PyObject *parameters)
{
    memset(h, 0, sizeof(*h));
    h->head.model_name = model;
    h->head.model_version = version;
    h->head.id = id;
    if (outputs != NULL && outputs != Py_None) {
        h->out_fast = PySequence_Fast(outputs, "outputs must be a sequence of names");
        if (h->out_fast == NULL)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(h->out_fast);
        h->outputs = calloc(n ? (size_t)n : 1, sizeof(char *));
        if (h->outputs == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            if ((h->outputs[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(h->out_fast, i))) == NULL)
                return -1;
        h->head.outputs = h->outputs;
        h->head.n_outputs = (uint32_t)n;
    }
    return collect_params(parameters, h);
}

/* A request encoded for sending: its parts as iovecs (and the references that keep the
 * header buffer and inputs alive). */
typedef struct {
    oi_pb_iov_t *parts;
    struct iovec *iov;
    size_t n;
} encoded_t;

static void encoded_clear(encoded_t *e)
{
    for (size_t i = 0; e->parts && i < e->n; i++)
        oi_buf_unref(e->parts[i].owner);
    free(e->parts);
    free(e->iov);
    memset(e, 0, sizeof(*e));
}

/* Encodes without needing the GIL. NULL, or a status. */
static oi_status_t *encode(const head_t *h, const oi_tensor_t *inputs, uint32_t n_inputs, encoded_t *e)
{
    size_t cap = OI_PB_REQUEST_PARTS(n_inputs), total;
    memset(e, 0, sizeof(*e));
    e->parts = calloc(cap, sizeof(*e->parts));
    e->iov = calloc(cap, sizeof(*e->iov));
    if (e->parts == NULL || e->iov == NULL) {
        encoded_clear(e);
        return oi_status_new(OI_INTERNAL, "out of memory");
    }
    oi_status_t *st = oi_pb_encode_infer_request(&h->head, inputs, n_inputs, e->parts, &e->n, &total);
    if (st != NULL) {
        encoded_clear(e);
        return st;
    }
    for (size_t i = 0; i < e->n; i++)
        e->iov[i] = (struct iovec){(void *)e->parts[i].base, e->parts[i].len};
    return NULL;
}

static void tensors_free(oi_tensor_t *t, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        oi_tensor_clear(&t[i]);
    free(t);
}

/* A decoded response as (model_name, model_version, id, outputs, datatypes). */
static PyObject *result_of(oi_pb_response_t *r)
{
    return oi__py_infer_result(&r->result, r->model_name.ptr, r->model_version.ptr);
}

static PyObject *Conn_infer(ConnObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model", "inputs", "outputs", "version", "request_id", "parameters", "timeout", NULL};
    const char *model, *version = NULL, *request_id = NULL;
    PyObject *inputs, *outputs = Py_None, *parameters = Py_None, *timeout = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|OzzOO", kwlist, &model, &inputs, &outputs, &version, &request_id,
                                     &parameters, &timeout))
        return NULL;
    oi_tensor_t *tensors = NULL;
    uint32_t n_in = 0;
    head_t h;
    PyObject *ret = NULL;
    int64_t tmo = oi__py_timeout_ms(timeout);
    if (make_head(&h, model, version, request_id, outputs, parameters) != 0 || tmo < 0 ||
        oi__py_collect_inputs(inputs, &tensors, &n_in) != 0 || conn_acquire(self) != 0)
        goto done;
    encoded_t e;
    oi_status_t *st, *dst = NULL;
    oi_buf_t *resp = NULL;
    oi_pb_response_t decoded;
    int rc = 0, status = 0;
    char *message = NULL, err[512];
    oi_py_io_t io;
    oi__py_io_begin(&io);
    st = encode(&h, tensors, n_in, &e);
    if (st == NULL) {
        rc = oi_grpc_client_unary(self->conn, SERVICE "ModelInfer", e.iov, (int)e.n, tmo, &resp, &status, &message, err,
                                  sizeof(err));
        encoded_clear(&e);
        if (rc == 0 && status == OI_GRPC_OK) {
            dst = oi_pb_decode_infer_response(resp, 0, &decoded);
            oi_buf_unref(resp); /* the decoded outputs hold their own references */
        }
    }
    oi__py_io_end(&io);
    PyThread_release_lock(self->lock);
    if (io.raised) { /* the exception stands */
        if (st == NULL && rc == 0) {
            free(message);
            if (status == OI_GRPC_OK && dst == NULL)
                oi_request_clear(&decoded.result);
            oi_status_free(dst);
        }
        oi_status_free(st);
    } else if (st != NULL) {
        PyErr_SetString(st->code == OI_BAD_REQUEST ? PyExc_ValueError : PyExc_MemoryError, st->message);
        oi_status_free(st);
    } else if (rc != 0) {
        conn_error(rc, err);
    } else if (status != OI_GRPC_OK) {
        ret = failed(status, message);
    } else if (dst != NULL) {
        free(message);
        PyErr_Format(dst->code == OI_BAD_REQUEST ? PyExc_ValueError : PyExc_MemoryError,
                     "malformed inference response: %s", dst->message);
        oi_status_free(dst);
    } else {
        free(message);
        PyObject *result = result_of(&decoded);
        oi_request_clear(&decoded.result);
        ret = result ? Py_BuildValue("(iN)", 0, result) : NULL;
    }
done:
    tensors_free(tensors, n_in);
    head_clear(&h);
    return ret;
}

/* ---- streaming ------------------------------------------------------------------------------ */

static PyObject *Conn_stream(ConnObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"model", "version", "outputs", "parameters", "timeout", NULL};
    PyObject *model, *version = Py_None, *outputs = Py_None, *parameters = Py_None, *timeout = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "U|OOOO", kwlist, &model, &version, &outputs, &parameters, &timeout))
        return NULL;
    if (version != Py_None && !PyUnicode_Check(version)) {
        PyErr_SetString(PyExc_TypeError, "version must be a str or None");
        return NULL;
    }
    int64_t tmo = oi__py_timeout_ms(timeout);
    if (tmo < 0)
        return NULL;
    head_t h; /* checked now, so that a bad argument fails here and not at the first send */
    int bad = make_head(&h, "", NULL, NULL, outputs, parameters);
    head_clear(&h);
    if (bad)
        return NULL;
    StreamObject *s = PyObject_New(StreamObject, &oi_py_grpc_stream_type);
    if (s == NULL)
        return NULL;
    s->call = NULL;
    Py_INCREF(self);
    s->conn = self;
    s->model = Py_NewRef(model);
    s->version = Py_NewRef(version);
    s->outputs = Py_NewRef(outputs);
    s->parameters = Py_NewRef(parameters);
    self->streams++;
    if (conn_acquire(self) != 0) {
        Py_DECREF(s);
        return NULL;
    }
    char err[512];
    int rc;
    oi_grpc_client_call_t *call;
    Py_BEGIN_ALLOW_THREADS
    call = oi_grpc_client_call_start(self->conn, SERVICE "ModelStreamInfer", tmo, &rc, err, sizeof(err));
    Py_END_ALLOW_THREADS
    PyThread_release_lock(self->lock);
    if (call == NULL) {
        Py_DECREF(s);
        return conn_error(rc, err);
    }
    s->call = call;
    return (PyObject *)s;
}

static int stream_acquire(StreamObject *s)
{
    if (s->call == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the stream is closed");
        return -1;
    }
    if (!PyThread_acquire_lock(s->conn->lock, NOWAIT_LOCK)) {
        PyErr_SetString(PyExc_RuntimeError, "this connection is in use by another thread");
        return -1;
    }
    return 0;
}

/* Frees the call (cancelling it when still open) and, after close(), the connection with the
 * last stream. */
static void stream_release_call(StreamObject *s)
{
    if (s->call == NULL)
        return;
    oi_grpc_client_call_free(s->call);
    s->call = NULL;
}

static void Stream_dealloc(StreamObject *s)
{
    if (s->call != NULL) {
        /* Wait for the lock without the GIL: its holder needs the GIL to let go of it. */
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(s->conn->lock, WAIT_LOCK);
        stream_release_call(s);
        PyThread_release_lock(s->conn->lock);
        Py_END_ALLOW_THREADS
    }
    ConnObject *conn = s->conn;
    conn->streams--;
    if (conn->closed && conn->streams == 0) {
        oi_grpc_client_free(conn->conn);
        conn->conn = NULL;
    }
    Py_DECREF(conn);
    Py_XDECREF(s->model);
    Py_XDECREF(s->version);
    Py_XDECREF(s->outputs);
    Py_XDECREF(s->parameters);
    PyObject_Free(s);
}

static PyObject *Stream_send(StreamObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"inputs", "request_id", NULL};
    PyObject *inputs;
    const char *request_id = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|z", kwlist, &inputs, &request_id))
        return NULL;
    const char *model = PyUnicode_AsUTF8(s->model);
    const char *version = s->version == Py_None ? NULL : PyUnicode_AsUTF8(s->version);
    if (model == NULL || (s->version != Py_None && version == NULL))
        return NULL;
    oi_tensor_t *tensors = NULL;
    uint32_t n_in = 0;
    head_t h;
    PyObject *ret = NULL;
    if (make_head(&h, model, version, request_id, s->outputs, s->parameters) != 0 ||
        oi__py_collect_inputs(inputs, &tensors, &n_in) != 0 || stream_acquire(s) != 0)
        goto done;
    encoded_t e;
    oi_status_t *st;
    int rc = 0;
    char err[512];
    Py_BEGIN_ALLOW_THREADS
    st = encode(&h, tensors, n_in, &e);
    if (st == NULL) {
        rc = oi_grpc_client_call_send(s->call, e.iov, (int)e.n, 0, err, sizeof(err));
        encoded_clear(&e);
    }
    Py_END_ALLOW_THREADS
    PyThread_release_lock(s->conn->lock);
    if (st != NULL) {
        PyErr_SetString(st->code == OI_BAD_REQUEST ? PyExc_ValueError : PyExc_MemoryError, st->message);
        oi_status_free(st);
    } else if (rc == OI_GRPC_CLIENT_ERROR || rc == OI_GRPC_CLIENT_TIMEOUT) {
        conn_error(rc, err);
    } else {
        ret = PyBool_FromLong(rc == 0);
    }
done:
    tensors_free(tensors, n_in);
    head_clear(&h);
    return ret;
}

static PyObject *Stream_close_send(StreamObject *s, PyObject *noargs)
{
    (void)noargs;
    if (stream_acquire(s) != 0)
        return NULL;
    char err[512];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = oi_grpc_client_call_close_send(s->call, err, sizeof(err));
    Py_END_ALLOW_THREADS
    PyThread_release_lock(s->conn->lock);
    if (rc == OI_GRPC_CLIENT_ERROR || rc == OI_GRPC_CLIENT_TIMEOUT)
        return conn_error(rc, err);
    Py_RETURN_NONE;
}

static PyObject *Stream_recv(StreamObject *s, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"nowait", NULL};
    int nowait = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p", kwlist, &nowait))
        return NULL;
    if (stream_acquire(s) != 0)
        return NULL;
    char err[512];
    int rc;
    oi_buf_t *msg = NULL;
    oi_status_t *st = NULL;
    oi_pb_response_t decoded;
    oi_py_io_t io;
    oi__py_io_begin(&io);
    rc = oi_grpc_client_call_recv(s->call, nowait, &msg, err, sizeof(err));
    if (rc == 0) {
        st = oi_pb_decode_infer_response(msg, 1, &decoded);
        oi_buf_unref(msg);
    }
    oi__py_io_end(&io);
    PyThread_release_lock(s->conn->lock);
    if (io.raised) { /* the exception stands */
        if (rc == 0 && st == NULL)
            oi_request_clear(&decoded.result);
        oi_status_free(st);
        return NULL;
    }
    if (rc == OI_GRPC_CLIENT_ENDED)
        Py_RETURN_NONE;
    if (rc == OI_GRPC_CLIENT_AGAIN)
        Py_RETURN_FALSE;
    if (rc != 0)
        return conn_error(rc, err);
    if (st != NULL) {
        PyErr_Format(st->code == OI_BAD_REQUEST ? PyExc_ValueError : PyExc_MemoryError, "malformed stream response: %s",
                     st->message);
        oi_status_free(st);
        return NULL;
    }
    PyObject *error = decoded.error_message.ptr ? message_str(decoded.error_message.ptr) : Py_NewRef(Py_None);
    PyObject *result = error ? result_of(&decoded) : NULL;
    oi_request_clear(&decoded.result);
    if (result == NULL) {
        Py_XDECREF(error);
        return NULL;
    }
    return Py_BuildValue("(NN)", error, result);
}

static PyObject *Stream_status(StreamObject *s, PyObject *noargs)
{
    (void)noargs;
    if (s->call == NULL)
        Py_RETURN_NONE;
    const char *message;
    int status = oi_grpc_client_call_status(s->call, &message);
    if (status < 0)
        Py_RETURN_NONE;
    PyObject *m = message_str(message);
    return m ? Py_BuildValue("(iN)", status, m) : NULL;
}

static PyObject *Stream_close(StreamObject *s, PyObject *noargs)
{
    (void)noargs;
    if (s->call != NULL) {
        if (stream_acquire(s) != 0)
            return NULL;
        Py_BEGIN_ALLOW_THREADS
        stream_release_call(s);
        Py_END_ALLOW_THREADS
        PyThread_release_lock(s->conn->lock);
    }
    Py_RETURN_NONE;
}

static PyMethodDef Stream_methods[] = {
    {"send", (PyCFunction)(void (*)(void))Stream_send, METH_VARARGS | METH_KEYWORDS,
     "send(inputs, request_id=None) -> bool: sends one request (inputs as for infer); False when the stream "
     "has already ended"},
    {"close_send", (PyCFunction)Stream_close_send, METH_NOARGS, "Ends the client's side of the stream."},
    {"recv", (PyCFunction)(void (*)(void))Stream_recv, METH_VARARGS | METH_KEYWORDS,
     "recv(nowait=False) -> (error_message or None, (model_name, model_version, id, outputs, datatypes)); "
     "None once the stream has ended (see status()); False with nowait when nothing has arrived"},
    {"status", (PyCFunction)Stream_status, METH_NOARGS, "(grpc_status, message) once ended, else None."},
    {"close", (PyCFunction)Stream_close, METH_NOARGS, "Cancels the stream if still open and frees it."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject oi_py_grpc_stream_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "openinfer._core.GrpcStream",
    .tp_basicsize = sizeof(StreamObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One ModelStreamInfer call on a GrpcConnection.",
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_methods = Stream_methods,
};

static PyObject *Conn_close(ConnObject *self, PyObject *noargs)
{
    (void)noargs;
    if (self->conn != NULL && !self->closed && PyThread_acquire_lock(self->lock, NOWAIT_LOCK)) {
        self->closed = 1;
        if (self->streams == 0) { /* else the last stream frees it */
            oi_grpc_client_free(self->conn);
            self->conn = NULL;
        }
        PyThread_release_lock(self->lock);
    }
    Py_RETURN_NONE;
}

static PyMethodDef Conn_methods[] = {
    {"server_live", (PyCFunction)(void (*)(void))Conn_server_live, METH_VARARGS | METH_KEYWORDS,
     "server_live(timeout=None) -> (status, bool or message)"},
    {"server_ready", (PyCFunction)(void (*)(void))Conn_server_ready, METH_VARARGS | METH_KEYWORDS,
     "server_ready(timeout=None) -> (status, bool or message)"},
    {"model_ready", (PyCFunction)(void (*)(void))Conn_model_ready, METH_VARARGS | METH_KEYWORDS,
     "model_ready(name, version=None, timeout=None) -> (status, bool or message)"},
    {"server_metadata", (PyCFunction)(void (*)(void))Conn_server_metadata, METH_VARARGS | METH_KEYWORDS,
     "server_metadata(timeout=None) -> (status, dict or message)"},
    {"model_metadata", (PyCFunction)(void (*)(void))Conn_model_metadata, METH_VARARGS | METH_KEYWORDS,
     "model_metadata(name, version=None, timeout=None) -> (status, dict or message)"},
    {"unary", (PyCFunction)(void (*)(void))Conn_unary, METH_VARARGS | METH_KEYWORDS,
     "unary(method, body=b'', timeout=None) -> (status, response bytes or message)"},
    {"infer", (PyCFunction)(void (*)(void))Conn_infer, METH_VARARGS | METH_KEYWORDS,
     "infer(model, inputs, outputs=None, version=None, request_id=None, parameters=None, timeout=None) -> "
     "(status, (model_name, model_version, id, outputs, datatypes) or message)"},
    {"stream", (PyCFunction)(void (*)(void))Conn_stream, METH_VARARGS | METH_KEYWORDS,
     "stream(model, version=None, outputs=None, parameters=None, timeout=None) -> GrpcStream"},
    {"close", (PyCFunction)Conn_close, METH_NOARGS, "Closes the connection."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject oi_py_grpc_conn_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "openinfer._core.GrpcConnection",
    .tp_basicsize = sizeof(ConnObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A gRPC (h2c) connection to a V2 server.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Conn_init,
    .tp_dealloc = (destructor)Conn_dealloc,
    .tp_methods = Conn_methods,
};
