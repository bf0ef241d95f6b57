#include "backends/python_backend.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "python/bridge.h"
#include "python/pb_objects.h"
#include "python/triton_execute.h"

typedef struct py_state_s {
    PyObject *handler;
    /* A model whose function takes the inputs alone (see oi_python_backend_state): called
     * directly, its dict read here; `select` only words what is wrong with another answer. */
    PyObject *fn, *select;
    /* A Triton Python model whose execute the core calls itself (triton_execute.c). */
    PyObject *triton;
    char *model_name;
    uint32_t n_outputs;
    struct {
        char *name;
        oi_dtype_t dtype;
    } outputs[]; /* declared datatypes: what the model's results are converted to */
} py_state_t;

static oi_dtype_t declared_dtype(const py_state_t *s, const char *name)
{
    for (uint32_t i = 0; i < s->n_outputs; i++)
        if (strcmp(s->outputs[i].name, name) == 0)
            return s->outputs[i].dtype;
    return OI_TYPE_INVALID;
}

/* The model's exception as a status: the message of an exception that carries an HTTP status
 * (openinfer.InferenceServerError; a Triton model's response error, worded as Triton words it,
 * 500 included) as it is, else 500 with the model's name and the exception's type. */
static oi_status_t *model_error(const py_state_t *s)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    int code = OI_INTERNAL, verbatim = 0;
    PyObject *status = value ? PyObject_GetAttrString(value, "status") : NULL;
    if (status != NULL && PyLong_Check(status)) {
        long v = PyLong_AsLong(status);
        if (oi_status_code_valid(v)) {
            code = (int)v;
            verbatim = 1;
        }
    }
    PyErr_Clear();
    Py_XDECREF(status);
    PyObject *msg = value ? PyObject_GetAttrString(value, "message") : NULL;
    if (msg == NULL || !PyUnicode_Check(msg)) {
        PyErr_Clear();
        Py_XDECREF(msg);
        msg = value ? PyObject_Str(value) : NULL;
    }
    const char *text = msg ? PyUnicode_AsUTF8(msg) : NULL;
    const char *tname = type ? ((PyTypeObject *)type)->tp_name : "error";
    oi_status_t *st = !verbatim
                          ? oi_status_new(code, "model '%s' raised %s: %s", s->model_name, tname, text ? text : "")
                          : oi_status_new(code, "%s", text ? text : tname);
    PyErr_Clear();
    Py_XDECREF(msg);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return st;
}

/* The fourth argument of a model's handler: called with no arguments, it tells whether every
 * client of the request (or batch) has gone. It reads the request's poll only while the
 * handler runs; a model that keeps it gets the last answer afterwards. */
typedef struct {
    PyObject_HEAD const oi_request_t *req; /* borrowed for the call; NULL after it */
    uint32_t n_outputs;                    /* the outputs asked (a row of req->batch_absent) */
    int last;
} cancel_flag_t;

static PyObject *cancel_flag_call(PyObject *self, PyObject *args, PyObject *kw)
{
    cancel_flag_t *f = (cancel_flag_t *)self;
    if (PyTuple_GET_SIZE(args) != 0 || (kw != NULL && PyDict_GET_SIZE(kw) != 0)) {
        PyErr_SetString(PyExc_TypeError, "CancelFlag() takes no arguments");
        return NULL;
    }
    if (f->req != NULL && f->req->cancelled != NULL)
        f->last = f->req->cancelled(f->req->cancelled_arg) != 0;
    return PyBool_FromLong(f->last);
}

/* An id as str (undecodable bytes replaced), or None. */
static PyObject *id_or_none(const char *id)
{
    return id != NULL ? PyUnicode_DecodeUTF8(id, (Py_ssize_t)strlen(id), "replace") : Py_NewRef(Py_None);
}

/* request_id(): the request's id, or None (none given, a batch, or after the call). */
static PyObject *cancel_flag_request_id(PyObject *self, PyObject *unused)
{
    (void)unused;
    const oi_request_t *req = ((cancel_flag_t *)self)->req;
    return id_or_none(req != NULL ? req->id : NULL);
}

/* bls_chain(): the models waiting up the BLS call chain for this request, '/'-separated and
 * outermost first (core/bls_chain.h), or None for a client's request (and after the call). */
static PyObject *cancel_flag_bls_chain(PyObject *self, PyObject *unused)
{
    (void)unused;
    const oi_request_t *req = ((cancel_flag_t *)self)->req;
    return id_or_none(req != NULL ? req->bls_chain : NULL);
}

/* batch(): for a dynamic batch the scheduler concatenated, a tuple of (rows, id or None,
 * parameters as bytes or None) per request in order; None for a lone request (and after the
 * call). */
static PyObject *cancel_flag_batch(PyObject *self, PyObject *unused)
{
    (void)unused;
    const oi_request_t *req = ((cancel_flag_t *)self)->req;
    if (req == NULL || req->n_batch == 0)
        Py_RETURN_NONE;
    PyObject *t = PyTuple_New(req->n_batch);
    for (uint32_t k = 0; t != NULL && k < req->n_batch; k++) {
        PyObject *id = id_or_none(req->batch_ids[k]);
        const oi_slice_t *p = req->batch_params != NULL ? &req->batch_params[k] : NULL;
        PyObject *params = p != NULL && p->ptr != NULL ? PyBytes_FromStringAndSize(p->ptr, (Py_ssize_t)p->len)
                                                       : Py_NewRef(Py_None);
        PyObject *item = NULL;
        if (id != NULL && params != NULL) /* "N" takes both references, also on failure */
            item = Py_BuildValue("(LNN)", (long long)req->batch_rows[k], id, params);
        else {
            Py_XDECREF(id);
            Py_XDECREF(params);
        }
        if (item == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, k, item);
    }
    return t;
}

/* fail(k, status, message): request k of the batch gets this error (an HTTP status, the text
 * as it is) instead of its rows, which the returned outputs must still hold. */
static PyObject *cancel_flag_fail(PyObject *self, PyObject *args)
{
    const oi_request_t *req = ((cancel_flag_t *)self)->req;
    unsigned int k;
    int status;
    const char *message;
    if (!PyArg_ParseTuple(args, "Iis:fail", &k, &status, &message))
        return NULL;
    if (req == NULL || req->batch_errors == NULL || k >= req->n_batch) {
        PyErr_Format(PyExc_IndexError, "fail(): no request %u in this call's batch", k);
        return NULL;
    }
    if (!oi_status_code_valid(status)) {
        PyErr_Format(PyExc_ValueError, "fail(): status %d is not an HTTP error status", status);
        return NULL;
    }
    oi_status_free(req->batch_errors[k]);
    req->batch_errors[k] = oi_status_new(status, "%s", message);
    Py_RETURN_NONE;
}

/* respond_parameters(k, text): request k of the batch gets these response parameters (JSON
 * text, checked by the caller as any response's are) with its rows. */
static PyObject *cancel_flag_respond_parameters(PyObject *self, PyObject *args)
{
    const oi_request_t *req = ((cancel_flag_t *)self)->req;
    unsigned int k;
    const char *text;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "Is#:respond_parameters", &k, &text, &len))
        return NULL;
    if (req == NULL || req->batch_resp_params == NULL || k >= req->n_batch) {
        PyErr_Format(PyExc_IndexError, "respond_parameters(): no request %u in this call's batch", k);
        return NULL;
    }
    oi_buf_t *buf = oi_buf_new((size_t)len);
    if (buf == NULL)
        return PyErr_NoMemory();
    memcpy(buf->data, text, (size_t)len);
    buf->len = (size_t)len;
    oi_buf_unref(req->batch_resp_params[k]);
    req->batch_resp_params[k] = buf;
    Py_RETURN_NONE;
}

/* leave_out(k, i): request k's own response lacks output i (of the outputs asked), which the
 * returned outputs still hold filler rows of for it. */
static PyObject *cancel_flag_leave_out(PyObject *self, PyObject *args)
{
    const cancel_flag_t *flag = (const cancel_flag_t *)self;
    unsigned int k, i;
    if (!PyArg_ParseTuple(args, "II:leave_out", &k, &i))
        return NULL;
    if (flag->req == NULL || flag->req->batch_absent == NULL || k >= flag->req->n_batch || i >= flag->n_outputs) {
        PyErr_Format(PyExc_IndexError, "leave_out(): no output %u of request %u in this call's batch", i, k);
        return NULL;
    }
    flag->req->batch_absent[(size_t)k * flag->n_outputs + i] = 1;
    Py_RETURN_NONE;
}

static PyMethodDef cancel_flag_methods[] = {
    {"request_id", cancel_flag_request_id, METH_NOARGS, "The request's id, or None."},
    {"batch", cancel_flag_batch, METH_NOARGS, "A dynamic batch's ((rows, id, parameters), ...), or None."},
    {"bls_chain", cancel_flag_bls_chain, METH_NOARGS, "The models waiting up the BLS call chain ('/'-separated), or None."},
    {"fail", cancel_flag_fail, METH_VARARGS, "fail(k, status, message): request k of the batch fails alone."},
    {"respond_parameters", cancel_flag_respond_parameters, METH_VARARGS,
     "respond_parameters(k, text): request k's response carries these parameters (JSON text)."},
    {"leave_out", cancel_flag_leave_out, METH_VARARGS, "leave_out(k, i): request k's response lacks output i."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject cancel_flag_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "openinfer._core.CancelFlag",
    .tp_basicsize = sizeof(cancel_flag_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_call = cancel_flag_call,
    .tp_methods = cancel_flag_methods,
    .tp_doc = "Called with no arguments: whether the request's clients have all gone. Its "
              "request_id(), batch() and bls_chain() describe the request while the model runs.",
};

static PyObject *make_inputs(const oi_request_t *req)
{
    PyObject *d = PyDict_New();
    for (uint32_t i = 0; d != NULL && i < req->n_inputs; i++) {
        PyObject *arr = oi_py_array_view(&req->inputs[i], 0);
        if (arr == NULL || PyDict_SetItemString(d, req->inputs[i].name, arr) != 0)
            Py_CLEAR(d);
        Py_XDECREF(arr);
    }
    return d;
}

/* A tuple of the names as str, or NULL with the exception set. */
static PyObject *name_tuple(const char *const *names, uint32_t n)
{
    PyObject *t = PyTuple_New(n);
    for (uint32_t i = 0; t != NULL && i < n; i++) {
        PyObject *u = PyUnicode_FromString(names[i]);
        if (u == NULL)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, u);
    }
    return t;
}

/* The status for a result `fn` gave that is not a dict holding every requested output: the
 * error the model's own `select` raises for it (NULL when select takes it: then *selected). */
static oi_status_t *select_result(const py_state_t *s, PyObject *result, const char *const *names, uint32_t n,
                                  PyObject **selected)
{
    PyObject *wanted = name_tuple(names, n);
    *selected = wanted ? PyObject_CallFunctionObjArgs(s->select, result, wanted, NULL) : NULL;
    Py_XDECREF(wanted);
    return *selected == NULL ? model_error(s) : NULL;
}

/* What a Triton Python model's answer (a dict subclass) carries beside its outputs: its
 * response parameters (`response_parameters`, JSON text, copied for the encoders) and
 * whether the final flag came with it (`response_final`). A plain dict carries neither. */
static oi_status_t *collect_triton_extras(PyObject *result, oi_response_t *resp)
{
    if (PyDict_CheckExact(result))
        return NULL;
    PyObject *final = PyObject_GetAttrString(result, "response_final");
    resp->final = final != NULL && PyObject_IsTrue(final) == 1;
    Py_XDECREF(final);
    PyObject *text = PyObject_GetAttrString(result, "response_parameters");
    if (text == NULL || text == Py_None) {
        PyErr_Clear();
        Py_XDECREF(text);
        return NULL;
    }
    Py_ssize_t len = 0;
    const char *utf8 = PyUnicode_Check(text) ? PyUnicode_AsUTF8AndSize(text, &len) : NULL;
    oi_status_t *st = NULL;
    if (utf8 == NULL) {
        PyErr_Clear();
        st = oi_status_new(OI_INTERNAL, "response_parameters must be JSON text");
    } else if ((resp->parameters = oi_buf_new((size_t)len)) == NULL) {
        st = oi_status_new(OI_INTERNAL, "out of memory");
    } else {
        memcpy(resp->parameters->data, utf8, (size_t)len);
        resp->parameters->len = (size_t)len;
    }
    Py_DECREF(text);
    return st;
}

/* Whether `result` is a Triton Python model's answer (triton_model._Answer), which may leave
 * out outputs as Triton's InferenceResponse may. */
static int leaves_out_outputs(PyObject *result)
{
    if (PyDict_CheckExact(result))
        return 0;
    PyObject *final = PyObject_GetAttrString(result, "response_final");
    if (final == NULL)
        PyErr_Clear();
    Py_XDECREF(final);
    return final != NULL;
}

/* Output `name` of the response, `v`, converted to its declared datatype into `t`. */
static oi_status_t *put_output(const py_state_t *s, PyObject *v, const char *name, oi_tensor_t *t)
{
    oi_status_t *st = oi_py_to_tensor(v, declared_dtype(s, name), "output", name, t);
    if (st != NULL) {
        oi_status_t *wrapped = oi_status_new(st->code, "model '%s' %s", s->model_name, st->message);
        oi_status_free(st);
        return wrapped;
    }
    t->name = name;
    return NULL;
}

static oi_status_t *collect_outputs(const py_state_t *s, PyObject *result, const char *const *names, uint32_t n,
                                    oi_response_t *resp)
{
    if (!PyMapping_Check(result))
        return oi_status_new(OI_INTERNAL, "model '%s' returned %s; expected a mapping of output names to arrays",
                             s->model_name, Py_TYPE(result)->tp_name);
    resp->outputs = calloc(n ? n : 1, sizeof(oi_tensor_t));
    if (resp->outputs == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    int partial = leaves_out_outputs(result);
    for (uint32_t i = 0; i < n; i++) {
        PyObject *v = PyMapping_GetItemString(result, names[i]);
        if (v == NULL && partial) {
            PyErr_Clear();
            resp->outputs[i] = (oi_tensor_t){.name = names[i], .absent = 1};
            resp->n_outputs = i + 1;
            continue;
        }
        if (v == NULL) {
            PyErr_Clear();
            PyObject *selected = NULL; /* a direct call's answer: select words the error */
            oi_status_t *st = s->select != NULL ? select_result(s, result, names, n, &selected) : NULL;
            Py_XDECREF(selected);
            return st != NULL ? st
                              : oi_status_new(OI_INTERNAL, "model '%s' did not return output '%s'", s->model_name, names[i]);
        }
        oi_status_t *st = put_output(s, v, names[i], &resp->outputs[i]);
        Py_DECREF(v);
        if (st != NULL)
            return st;
        resp->n_outputs = i + 1;
    }
    return collect_triton_extras(result, resp);
}

/* A Triton Python model's own response (the common answer, triton_execute.c): each asked
 * output's array as it is, no mapping built. */
static oi_status_t *collect_response(const py_state_t *s, PyObject *response, const char *const *names, uint32_t n,
                                     oi_response_t *resp)
{
    resp->outputs = calloc(n ? n : 1, sizeof(oi_tensor_t));
    if (resp->outputs == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        oi_status_t *st = put_output(s, oi_py_triton_output(response, names[i]), names[i], &resp->outputs[i]);
        if (st != NULL)
            return st;
        resp->n_outputs = i + 1;
    }
    return NULL;
}

/* A decoupled model's handler returns an iterator of responses: each goes to the client
 * through the request's `send` as soon as it is produced, without the GIL (send may wait for
 * a slow client, which holds the model back). When the client has gone, or a response is
 * wrong, the iterator is closed (a generator sees GeneratorExit) and its status ends the
 * request; an error the model raises ends it after the responses already sent. */
static oi_status_t *stream_responses(const py_state_t *s, PyObject *it, const oi_request_t *req,
                                     const char *const *names, uint32_t n)
{
    if (!PyIter_Check(it))
        return oi_status_new(OI_INTERNAL, "model '%s' is decoupled but returned %s; expected an iterator of responses",
                             s->model_name, Py_TYPE(it)->tp_name);
    oi_status_t *st = NULL;
    PyObject *item;
    while (st == NULL && (item = PyIter_Next(it)) != NULL) {
        oi_response_t one = {0};
        st = collect_outputs(s, item, names, n, &one);
        Py_DECREF(item);
        if (st != NULL) {
            oi_response_clear(&one);
            break;
        }
        PyThreadState *ts = PyEval_SaveThread();
        st = req->send(req->send_arg, &one);
        PyEval_RestoreThread(ts);
        oi_py_owner_flush(); /* the responses written meanwhile: their arrays go now */
    }
    if (st == NULL && PyErr_Occurred())
        return model_error(s);
    if (st != NULL) { /* stopped early: the model's own clean-up runs now */
        PyObject *r = PyObject_CallMethod(it, "close", NULL);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    return st;
}

/* Each executor thread keeps one Python thread state for its whole life: PyGILState_Ensure /
 * Release around every call would create and destroy one (and its frame stack) per request. */
static pthread_key_t tstate_key;
static pthread_once_t tstate_once = PTHREAD_ONCE_INIT;

static void drop_tstate(void *p)
{
    if (!Py_IsInitialized())
        return;
    PyEval_RestoreThread(p);
    oi_py_clear_thread_locals();
    PyThreadState_Clear(p);
    PyThreadState_DeleteCurrent(); /* also releases the GIL */
}

static void make_tstate_key(void) { pthread_key_create(&tstate_key, drop_tstate); }

/* An executor ends: its thread state goes now, while Python's own thread-specific record of it
 * is intact. Left to the key's destructor, it may be torn down after that record was cleared,
 * and a destructor that takes the GIL meanwhile (gevent's hub in a thread-local) would make a
 * second state for the thread and wait forever for the GIL this thread holds. */
static void py_thread_end(void *state)
{
    (void)state;
    pthread_once(&tstate_once, make_tstate_key);
    PyThreadState *ts = pthread_getspecific(tstate_key);
    if (ts == NULL)
        return;
    pthread_setspecific(tstate_key, NULL);
    drop_tstate(ts);
}

/* Takes the GIL with this thread's own state, made on first use. */
static void enter_python(void)
{
    pthread_once(&tstate_once, make_tstate_key);
    PyThreadState *ts = pthread_getspecific(tstate_key);
    if (ts != NULL) {
        PyEval_RestoreThread(ts);
        return;
    }
    PyGILState_Ensure(); /* never released: the state lives until the thread ends */
    pthread_setspecific(tstate_key, PyThreadState_Get());
}

int oi_python_backend_on_executor(void)
{
    pthread_once(&tstate_once, make_tstate_key);
    PyThreadState *ts = pthread_getspecific(tstate_key);
    return ts != NULL && ts == PyThreadState_Get();
}

/* fn(inputs) for a model that takes nothing else: the handler's work without its three
 * Python frames, a new dict and the call's other arguments (the `simple` model on one CPU:
 * 1.06x the requests/s over HTTP at 8 and 64 connections, 1.05x over gRPC at 64). A result
 * other than a dict, or a dict without a requested output, goes through the model's own
 * `select`, which converts it or raises the error a client gets. */
static oi_status_t *call_direct(py_state_t *s, const oi_request_t *req, const char *const *names, uint32_t n,
                                oi_response_t *resp)
{
    PyObject *inputs = make_inputs(req);
    PyObject *result = inputs ? PyObject_CallOneArg(s->fn, inputs) : NULL;
    Py_XDECREF(inputs);
    if (result == NULL)
        return model_error(s);
    oi_status_t *st = NULL;
    if (!PyDict_CheckExact(result)) { /* select converts it (a Mapping) or raises */
        PyObject *selected;
        st = select_result(s, result, names, n, &selected);
        Py_SETREF(result, selected);
    }
    if (st == NULL)
        st = collect_outputs(s, result, names, n, resp); /* a missing output: select words it */
    Py_XDECREF(result);
    return st;
}

static cancel_flag_t *new_flag(const oi_request_t *req, uint32_t n_outputs)
{
    cancel_flag_t *flag = PyObject_New(cancel_flag_t, &cancel_flag_type);
    if (flag != NULL) {
        flag->req = req;
        flag->n_outputs = n_outputs;
        flag->last = 0;
    }
    return flag;
}

/* The call is over: the flag keeps its last answer, the request is not the model's to keep. */
static void end_flag(cancel_flag_t *flag)
{
    if (flag->req->cancelled != NULL)
        flag->last = flag->req->cancelled(flag->req->cancelled_arg) != 0;
    flag->req = NULL;
}

/* A Triton Python model's request or dynamic batch, its execute called here (triton_execute.c). */
static oi_status_t *call_triton(py_state_t *s, const oi_request_t *req, const char *const *names, uint32_t n,
                                oi_response_t *resp)
{
    cancel_flag_t *flag = new_flag(req, n);
    PyObject *answer = flag != NULL ? oi_py_triton_execute(s->triton, req, names, n, (PyObject *)flag) : NULL;
    oi_status_t *st;
    if (answer == NULL)
        st = model_error(s);
    else if (PyObject_TypeCheck(answer, &oi_py_pb_response_type))
        st = collect_response(s, answer, names, n, resp);
    else
        st = collect_outputs(s, answer, names, n, resp);
    Py_XDECREF(answer);
    if (flag != NULL)
        end_flag(flag);
    Py_XDECREF(flag);
    return st;
}

static oi_status_t *py_execute(void *state, const oi_request_t *req, const char *const *names, uint32_t n,
                               oi_response_t *resp)
{
    py_state_t *s = state;
    enter_python();
    oi_py_owner_flush(); /* earlier responses' arrays, released by loop threads */
    if (s->fn != NULL && req->send == NULL) {
        oi_status_t *st = call_direct(s, req, names, n, resp);
        PyEval_SaveThread();
        return st;
    }
    if (s->triton != NULL && req->send == NULL) {
        oi_status_t *st = call_triton(s, req, names, n, resp);
        PyEval_SaveThread();
        return st;
    }
    oi_status_t *st = NULL;
    PyObject *inputs = make_inputs(req);
    PyObject *params = req->parameters.ptr ? PyBytes_FromStringAndSize(req->parameters.ptr, (Py_ssize_t)req->parameters.len)
                                           : Py_NewRef(Py_None);
    PyObject *out_names = name_tuple(names, n);
    cancel_flag_t *flag = new_flag(req, n);
    if (inputs == NULL || params == NULL || out_names == NULL || flag == NULL) {
        st = model_error(s);
    } else {
        PyObject *result = PyObject_CallFunctionObjArgs(s->handler, inputs, params, out_names, flag, NULL);
        if (result == NULL)
            st = model_error(s);
        else {
            st = req->send != NULL ? stream_responses(s, result, req, names, n)
                                   : collect_outputs(s, result, names, n, resp);
            Py_DECREF(result);
        }
        end_flag(flag);
    }
    Py_XDECREF(inputs);
    Py_XDECREF(params);
    Py_XDECREF(out_names);
    Py_XDECREF(flag);
    PyEval_SaveThread();
    return st;
}

static void py_release_memory(py_state_t *s)
{
    free(s->model_name);
    for (uint32_t i = 0; i < s->n_outputs; i++)
        free(s->outputs[i].name);
    free(s);
}

void *oi_python_backend_state(PyObject *handler, PyObject *fn, PyObject *select, PyObject *triton,
                              const char *model_name, const oi_io_spec_t *outputs, uint32_t n_outputs)
{
    if (PyType_Ready(&cancel_flag_type) != 0) /* with the GIL, as every caller holds it */
        return NULL;
    py_state_t *s = calloc(1, sizeof(*s) + n_outputs * sizeof(s->outputs[0]));
    if (s == NULL || (s->model_name = strdup(model_name)) == NULL) {
        free(s);
        return NULL;
    }
    for (uint32_t i = 0; i < n_outputs; i++) {
        s->outputs[i].dtype = outputs[i].dtype;
        if ((s->outputs[i].name = strdup(outputs[i].name)) == NULL) {
            s->n_outputs = i;
            s->handler = NULL;
            py_release_memory(s);
            return NULL;
        }
    }
    s->n_outputs = n_outputs;
    s->handler = Py_NewRef(handler);
    s->fn = Py_XNewRef(fn);
    s->select = Py_XNewRef(select);
    s->triton = Py_XNewRef(triton);
    return s;
}

static void py_release(void *state)
{
    py_state_t *s = state;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF(s->handler);
    Py_XDECREF(s->fn);
    Py_XDECREF(s->select);
    Py_XDECREF(s->triton);
    PyGILState_Release(g);
    py_release_memory(s);
}

const oi_backend_t oi_python_backend = {
    .name = "python",
    .execute = py_execute,
    .release = py_release,
    .thread_end = py_thread_end,
    .runs_on_caller = 1,
};
