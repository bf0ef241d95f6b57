/* _core.TritonExecute: a Triton Python model's execute called by the core itself, as an
 * infer() model's function is (python_backend.c). What the adapter
 * (python/openinfer/_backends/triton_model.py, TritonModel.handler) does in Python for every
 * request is done here without a Python frame: the pb_utils.InferenceRequests built straight
 * from the core's arrays (a dynamic batch's each viewing its own rows, with its own id and
 * parameters; the input Tensors named by the model's own declared str objects), an instance
 * taken from the pool, pb_utils' serving context set around the call, and the returned
 * responses' arrays handed to the core as they are (a batch's joined by rows). Any other
 * outcome (an error, a response with parameters or an error, a rescheduled request, a response
 * sent through the sender, an asked output left out or BYTES) goes to the adapter's
 * `_conclude`, which answers as its handler does. TritonModel.direct says which models may take
 * this path. */
#include "python/triton_execute.h"

#include "python/bridge.h"
#include "python/pb_objects.h"

#include <string.h>

typedef struct {
    PyObject_HEAD PyObject *get, *put; /* the instance pool's (a SimpleQueue's) get and put */
    PyObject *conclude;                /* TritonModel._conclude */
    PyObject *serving_var;             /* pb_utils' _serving_var */
    PyObject *host, *model_name, *version_dir;
    PyObject *input_names, *input_datatypes; /* tuples of str, the model's declared inputs */
    PyObject *output_names;                  /* tuple of str, its declared outputs */
    PyTypeObject *request_type, *tensor_type, *response_type; /* pb_utils' classes */
    PyObject *json_loads;
} triton_execute_t;

/* Strings made once: a lookup by C string makes a str each time. */
static PyObject *s_execute, *s_take_parameters, *s_empty, *s_empty_json;

static int str_is(PyObject *u, const char *c)
{
    const char *utf8 = PyUnicode_Check(u) ? PyUnicode_AsUTF8(u) : NULL;
    if (utf8 == NULL)
        PyErr_Clear();
    return utf8 != NULL && strcmp(utf8, c) == 0;
}

/* The item of `declared` (a tuple of str) that spells `name`, borrowed, or NULL. */
static PyObject *declared_str(PyObject *declared, const char *name)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(declared); i++)
        if (str_is(PyTuple_GET_ITEM(declared, i), name))
            return PyTuple_GET_ITEM(declared, i);
    return NULL;
}

/* The response's output Tensor `name` (borrowed; the last of that name, as the adapter's
 * mapping of them keeps), or NULL. */
static PyObject *output_tensor(PyObject *response, const char *name)
{
    PyObject *outputs = OI_PB_FIELD(response, OI_PB_RESPONSE_OUTPUTS), *found = NULL;
    for (Py_ssize_t i = 0; outputs != NULL && PyList_CheckExact(outputs) && i < PyList_GET_SIZE(outputs); i++) {
        PyObject *t = PyList_GET_ITEM(outputs, i); /* TensorBase: InferenceResponse's init checks */
        PyObject *tname = OI_PB_FIELD(t, OI_PB_TENSOR_NAME);
        if (tname != NULL && str_is(tname, name))
            found = t;
    }
    return found;
}

PyObject *oi_py_triton_output(PyObject *response, const char *name)
{
    PyObject *tensor = output_tensor(response, name);
    return tensor != NULL ? OI_PB_FIELD(tensor, OI_PB_TENSOR_ARRAY) : NULL;
}

/* One input as a pb_utils.Tensor of `array` (a view of the request's memory; the reference is
 * taken). */
static PyObject *input_tensor(triton_execute_t *te, const oi_tensor_t *in, PyObject *array)
{
    if (array == NULL)
        return NULL;
    PyObject *tensor = te->tensor_type->tp_alloc(te->tensor_type, 0);
    if (tensor == NULL) {
        Py_DECREF(array);
        return NULL;
    }
    PyObject *name = NULL, *datatype = NULL;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(te->input_names) && name == NULL; j++) {
        if (str_is(PyTuple_GET_ITEM(te->input_names, j), in->name)) {
            name = Py_NewRef(PyTuple_GET_ITEM(te->input_names, j));
            datatype = Py_NewRef(PyTuple_GET_ITEM(te->input_datatypes, j));
        }
    }
    if (name == NULL) { /* the core serves declared inputs alone: this is a safeguard */
        name = PyUnicode_FromString(in->name);
        datatype = PyUnicode_FromString(oi_dtype_name(in->dtype));
    }
    OI_PB_FIELD(tensor, OI_PB_TENSOR_NAME) = name;
    OI_PB_FIELD(tensor, OI_PB_TENSOR_ARRAY) = array;
    OI_PB_FIELD(tensor, OI_PB_TENSOR_DATATYPE) = datatype;
    if (name == NULL || datatype == NULL)
        Py_CLEAR(tensor);
    return tensor;
}

/* The asked output names as a list of str, the declared ones' own objects. */
static PyObject *asked_names(triton_execute_t *te, const char *const *names, uint32_t n)
{
    PyObject *list = PyList_New(n);
    for (uint32_t i = 0; list != NULL && i < n; i++) {
        PyObject *name = declared_str(te->output_names, names[i]);
        name = name != NULL ? Py_NewRef(name) : PyUnicode_FromString(names[i]);
        if (name == NULL)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, name);
    }
    return list;
}

/* The request's inputs as read-only arrays viewing all their rows (a tuple). */
static PyObject *input_views(const oi_request_t *req)
{
    PyObject *views = PyTuple_New(req->n_inputs);
    for (uint32_t i = 0; views != NULL && i < req->n_inputs; i++) {
        PyObject *array = oi_py_array_view(&req->inputs[i], 0);
        if (array == NULL)
            Py_CLEAR(views);
        else
            PyTuple_SET_ITEM(views, i, array);
    }
    return views;
}

/* The pb_utils.InferenceRequest execute gets, as InferenceRequest._served builds one: request k
 * of a dynamic batch (its `rows` of the inputs' `views` from `start`, its own id and
 * parameters), or the lone request (rows < 0: the whole views). */
static PyObject *make_request(triton_execute_t *te, const oi_request_t *req, uint32_t k, PyObject *views,
                              Py_ssize_t start, Py_ssize_t rows, const char *const *names, uint32_t n, PyObject *flag)
{
    PyObject *request = te->request_type->tp_alloc(te->request_type, 0);
    PyObject *inputs = PyList_New(req->n_inputs);
    if (request == NULL || inputs == NULL) {
        Py_XDECREF(request);
        Py_XDECREF(inputs);
        return NULL;
    }
    for (uint32_t i = 0; i < req->n_inputs; i++) {
        PyObject *view = PyTuple_GET_ITEM(views, i);
        view = rows < 0 ? Py_NewRef(view) : PySequence_GetSlice(view, start, start + rows);
        PyObject *tensor = input_tensor(te, &req->inputs[i], view);
        if (tensor == NULL) {
            Py_DECREF(request);
            Py_DECREF(inputs);
            return NULL;
        }
        PyList_SET_ITEM(inputs, i, tensor);
    }
    PyObject **f = &OI_PB_FIELD(request, 0);
    f[OI_PB_REQUEST_MODEL_NAME] = Py_NewRef(te->model_name);
    f[OI_PB_REQUEST_INPUTS] = inputs;
    f[OI_PB_REQUEST_REQUESTED] = asked_names(te, names, n);
    const char *id = rows < 0 ? req->id : req->batch_ids[k];
    f[OI_PB_REQUEST_ID] = id != NULL ? PyUnicode_DecodeUTF8(id, (Py_ssize_t)strlen(id), "replace") : Py_NewRef(s_empty);
    f[OI_PB_REQUEST_CORRELATION_ID] = PyLong_FromLong(0);
    f[OI_PB_REQUEST_FLAGS] = PyLong_FromLong(0);
    f[OI_PB_REQUEST_TIMEOUT] = PyLong_FromLong(0);
    f[OI_PB_REQUEST_MODEL_VERSION] = PyLong_FromLong(-1);
    f[OI_PB_REQUEST_PARAMETERS] = Py_NewRef(s_empty_json);
    f[OI_PB_REQUEST_CANCELLED] = Py_NewRef(flag);
    f[OI_PB_REQUEST_SENDER] = Py_NewRef(Py_None);
    f[OI_PB_REQUEST_DECOUPLED] = Py_NewRef(Py_False);
    f[OI_PB_REQUEST_RELEASE_FLAGS] = PyLong_FromLong(1); /* TRITONSERVER_REQUEST_RELEASE_ALL */
    if (f[OI_PB_REQUEST_REQUESTED] == NULL || f[OI_PB_REQUEST_ID] == NULL) {
        Py_DECREF(request);
        return NULL;
    }
    const oi_slice_t *own = rows < 0 ? &req->parameters : req->batch_params != NULL ? &req->batch_params[k] : NULL;
    if (own != NULL && own->ptr != NULL) { /* the request's parameters: its fields and parameters() */
        PyObject *text = PyBytes_FromStringAndSize(own->ptr, (Py_ssize_t)own->len);
        PyObject *params = text != NULL ? PyObject_CallOneArg(te->json_loads, text) : NULL;
        PyObject *done = params != NULL ? PyObject_CallMethodOneArg(request, s_take_parameters, params) : NULL;
        Py_XDECREF(text);
        Py_XDECREF(params);
        if (done == NULL)
            Py_CLEAR(request);
        Py_XDECREF(done);
    }
    return request;
}

/* Whether `response`, execute's answer to `request`, is a plain one: no error or parameters,
 * every asked output in it and none of those BYTES (items other than bytes and str are the
 * adapter's to word), the request neither rescheduled nor answered through its sender. */
static int plain_answer(triton_execute_t *te, PyObject *response, PyObject *request, const char *const *names,
                        uint32_t n)
{
    PyObject *release = OI_PB_FIELD(request, OI_PB_REQUEST_RELEASE_FLAGS);
    int overflow;
    if (Py_TYPE(response) != te->response_type || OI_PB_FIELD(response, OI_PB_RESPONSE_ERROR) != Py_None ||
        OI_PB_FIELD(response, OI_PB_RESPONSE_PARAMETERS) != Py_None || OI_PB_FIELD(request, OI_PB_REQUEST_SENDER) != Py_None ||
        release == NULL || !PyLong_CheckExact(release) || PyLong_AsLongAndOverflow(release, &overflow) != 1)
        return 0; /* RELEASE_ALL is 1 */
    for (uint32_t i = 0; i < n; i++) {
        PyObject *tensor = output_tensor(response, names[i]);
        PyObject *datatype = tensor != NULL ? OI_PB_FIELD(tensor, OI_PB_TENSOR_DATATYPE) : NULL;
        if (datatype == NULL || OI_PB_FIELD(tensor, OI_PB_TENSOR_ARRAY) == NULL || str_is(datatype, "BYTES"))
            return 0;
    }
    return 1;
}

/* A dynamic batch's plain responses joined by rows, each asked output the concatenation of
 * theirs (a dict), for the core to split again; NULL (no exception set) where numpy cannot
 * join them: the adapter then words the error. */
static PyObject *joined(PyObject *responses, const char *const *names, uint32_t n)
{
    PyObject *answer = PyDict_New();
    for (uint32_t i = 0; answer != NULL && i < n; i++) {
        PyObject *parts = PyList_New(PyList_GET_SIZE(responses));
        for (Py_ssize_t k = 0; parts != NULL && k < PyList_GET_SIZE(responses); k++)
            PyList_SET_ITEM(parts, k, Py_NewRef(oi_py_triton_output(PyList_GET_ITEM(responses, k), names[i])));
        PyObject *whole = parts != NULL ? PyArray_Concatenate(parts, 0) : NULL;
        if (whole == NULL || PyDict_SetItemString(answer, names[i], whole) != 0)
            Py_CLEAR(answer);
        Py_XDECREF(whole);
        Py_XDECREF(parts);
    }
    if (answer == NULL)
        PyErr_Clear();
    return answer;
}

/* execute's result when it is the common answer, a plain response for each request: that
 * response for a lone request, the batch's joined outputs for a dynamic batch (a new
 * reference). NULL otherwise (no exception set). */
static PyObject *common_answer(triton_execute_t *te, PyObject *result, PyObject *requests, const char *const *names,
                               uint32_t n, int batch)
{
    if (result == NULL || !PyList_CheckExact(result) || PyList_GET_SIZE(result) != PyList_GET_SIZE(requests))
        return NULL;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(result); k++)
        if (!plain_answer(te, PyList_GET_ITEM(result, k), PyList_GET_ITEM(requests, k), names, n))
            return NULL;
    return batch ? joined(result, names, n) : Py_NewRef(PyList_GET_ITEM(result, 0));
}

/* Any other outcome: the adapter's _conclude(instance, requests, outputs, cancelled, result,
 * error) answers it, `error` the Exception execute raised (None when it returned `result`).
 * Anything that is not an Exception (SystemExit, ...) goes on up, as from the handler. */
static PyObject *conclude(triton_execute_t *te, PyObject *instance, PyObject *requests, PyObject *flag,
                          PyObject *result)
{
    PyObject *error = NULL;
    if (result == NULL) {
        PyObject *type, *tb;
        PyErr_Fetch(&type, &error, &tb);
        PyErr_NormalizeException(&type, &error, &tb);
        if (!PyErr_GivenExceptionMatches(type, PyExc_Exception)) {
            PyErr_Restore(type, error, tb);
            return NULL;
        }
        if (tb != NULL)
            PyException_SetTraceback(error, tb);
        Py_XDECREF(type);
        Py_XDECREF(tb);
    }
    PyObject *outputs = PyList_AsTuple(OI_PB_FIELD(PyList_GET_ITEM(requests, 0), OI_PB_REQUEST_REQUESTED));
    PyObject *answer = outputs == NULL ? NULL
                                       : PyObject_CallFunctionObjArgs(te->conclude, instance, requests, outputs, flag,
                                                                      result != NULL ? result : Py_None,
                                                                      error != NULL ? error : Py_None, NULL);
    Py_XDECREF(outputs);
    Py_XDECREF(error);
    return answer;
}

/* Calls fn(arg) for its effect, keeping the exception (if any) that was set before. */
static void call_keeping_error(PyObject *fn, PyObject *arg)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = PyObject_CallOneArg(fn, arg);
    if (r == NULL)
        PyErr_WriteUnraisable(fn);
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
}

/* The requests execute gets: the lone request, or each of a dynamic batch's (a list). */
static PyObject *make_requests(triton_execute_t *te, const oi_request_t *req, const char *const *names, uint32_t n,
                               PyObject *flag)
{
    uint32_t count = req->n_batch ? req->n_batch : 1;
    PyObject *views = input_views(req);
    PyObject *requests = views != NULL ? PyList_New(count) : NULL;
    Py_ssize_t start = 0;
    for (uint32_t k = 0; requests != NULL && k < count; k++) {
        Py_ssize_t rows = req->n_batch ? (Py_ssize_t)req->batch_rows[k] : -1;
        PyObject *request = make_request(te, req, k, views, start, rows, names, n, flag);
        if (request == NULL)
            Py_CLEAR(requests);
        else
            PyList_SET_ITEM(requests, k, request);
        start += rows;
    }
    Py_XDECREF(views);
    return requests;
}

PyObject *oi_py_triton_execute(PyObject *self, const oi_request_t *req, const char *const *names, uint32_t n,
                               PyObject *flag)
{
    triton_execute_t *te = (triton_execute_t *)self;
    PyObject *requests = make_requests(te, req, names, n, flag);
    PyObject *instance = requests != NULL ? PyObject_CallNoArgs(te->get) : NULL;
    if (instance == NULL) {
        Py_XDECREF(requests);
        return NULL;
    }
    PyObject *answer = NULL, *token = NULL;
    PyObject *serving = PyTuple_Pack(4, te->host, te->model_name, flag, te->version_dir);
    if (serving != NULL)
        token = PyContextVar_Set(te->serving_var, serving);
    Py_XDECREF(serving);
    if (token != NULL) {
        /* execute may keep or change the list it is given: it gets its own */
        PyObject *given = PyList_GetSlice(requests, 0, PyList_GET_SIZE(requests));
        PyObject *result = given != NULL ? PyObject_CallMethodOneArg(instance, s_execute, given) : NULL;
        Py_XDECREF(given);
        answer = common_answer(te, result, requests, names, n, req->n_batch > 0);
        if (answer == NULL)
            answer = conclude(te, instance, requests, flag, result);
        Py_XDECREF(result);
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (PyContextVar_Reset(te->serving_var, token) != 0)
            PyErr_WriteUnraisable(te->serving_var);
        PyErr_Restore(type, value, tb);
        Py_DECREF(token);
    }
    call_keeping_error(te->put, instance);
    Py_DECREF(instance);
    Py_DECREF(requests);
    return answer;
}

/* TritonExecute(free, conclude, serving_var, serving, inputs, outputs, classes): `free` the
 * instance pool (a queue.SimpleQueue), `serving` (host, model name, version folder) for
 * pb_utils' context, `inputs` ((name, datatype), ...) and `outputs` (name, ...) the declared
 * tensors, `classes` pb_utils' (InferenceRequest, Tensor, InferenceResponse). */
static PyObject *triton_execute_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *keywords[] = {"free", "conclude", "serving_var", "serving", "inputs", "outputs", "classes", NULL};
    PyObject *free_queue, *conclude_fn, *var, *inputs, *outputs, *request_type, *tensor_type, *response_type, *host,
        *name, *version_dir;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO(OUU)O!O!(O!O!O!):TritonExecute", keywords, &free_queue,
                                     &conclude_fn, &var, &host, &name, &version_dir, &PyTuple_Type, &inputs,
                                     &PyTuple_Type, &outputs, &PyType_Type, &request_type, &PyType_Type, &tensor_type,
                                     &PyType_Type, &response_type))
        return NULL;
    if (!PyContextVar_CheckExact(var) || !PyType_IsSubtype((PyTypeObject *)request_type, &oi_py_pb_request_type) ||
        !PyType_IsSubtype((PyTypeObject *)tensor_type, &oi_py_pb_tensor_type) ||
        !PyType_IsSubtype((PyTypeObject *)response_type, &oi_py_pb_response_type)) {
        PyErr_SetString(PyExc_TypeError, "TritonExecute: serving_var must be a ContextVar and classes pb_utils' "
                                         "(InferenceRequest, Tensor, InferenceResponse)");
        return NULL;
    }
    if (s_execute == NULL && ((s_execute = PyUnicode_InternFromString("execute")) == NULL ||
                              (s_take_parameters = PyUnicode_InternFromString("_take_parameters")) == NULL ||
                              (s_empty = PyUnicode_FromString("")) == NULL ||
                              (s_empty_json = PyUnicode_FromString("{}")) == NULL))
        return NULL;
    triton_execute_t *te = (triton_execute_t *)type->tp_alloc(type, 0);
    if (te == NULL)
        return NULL;
    te->input_names = PyTuple_New(PyTuple_GET_SIZE(inputs));
    te->input_datatypes = PyTuple_New(PyTuple_GET_SIZE(inputs));
    PyObject *json = PyImport_ImportModule("json");
    te->json_loads = json != NULL ? PyObject_GetAttrString(json, "loads") : NULL;
    Py_XDECREF(json);
    te->get = PyObject_GetAttrString(free_queue, "get");
    te->put = PyObject_GetAttrString(free_queue, "put");
    if (te->input_names == NULL || te->input_datatypes == NULL || te->json_loads == NULL || te->get == NULL ||
        te->put == NULL) {
        Py_DECREF(te);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(inputs); i++) {
        PyObject *input_name, *datatype;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(inputs, i), "UU;inputs holds (name, datatype) pairs", &input_name,
                              &datatype)) {
            Py_DECREF(te);
            return NULL;
        }
        PyTuple_SET_ITEM(te->input_names, i, Py_NewRef(input_name));
        PyTuple_SET_ITEM(te->input_datatypes, i, Py_NewRef(datatype));
    }
    te->conclude = Py_NewRef(conclude_fn);
    te->serving_var = Py_NewRef(var);
    te->host = Py_NewRef(host);
    te->model_name = Py_NewRef(name);
    te->version_dir = Py_NewRef(version_dir);
    te->output_names = Py_NewRef(outputs);
    te->request_type = (PyTypeObject *)Py_NewRef(request_type);
    te->tensor_type = (PyTypeObject *)Py_NewRef(tensor_type);
    te->response_type = (PyTypeObject *)Py_NewRef(response_type);
    return (PyObject *)te;
}

static void triton_execute_dealloc(PyObject *self)
{
    triton_execute_t *te = (triton_execute_t *)self;
    Py_XDECREF(te->get);
    Py_XDECREF(te->put);
    Py_XDECREF(te->conclude);
    Py_XDECREF(te->serving_var);
    Py_XDECREF(te->host);
    Py_XDECREF(te->model_name);
    Py_XDECREF(te->version_dir);
    Py_XDECREF(te->input_names);
    Py_XDECREF(te->input_datatypes);
    Py_XDECREF(te->output_names);
    Py_XDECREF(te->request_type);
    Py_XDECREF(te->tensor_type);
    Py_XDECREF(te->response_type);
    Py_XDECREF(te->json_loads);
    Py_TYPE(self)->tp_free(self);
}

PyTypeObject oi_py_triton_execute_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "openinfer._core.TritonExecute",
    .tp_basicsize = sizeof(triton_execute_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = triton_execute_new,
    .tp_dealloc = triton_execute_dealloc,
    .tp_doc = "A Triton Python model's execute as the core calls it (add_model's direct).",
};
