/* Business logic scripting: an inference a model makes on the server that runs it
 * (pb_utils.InferenceRequest.exec). The request is built in memory from numpy arrays (no copy:
 * each input's owner keeps its array), checked and queued on the target model's scheduler (or
 * its sequence batcher) as the transports' requests are, and its responses are kept here until
 * the calling model takes them: no socket, no loop thread. */
#include "python/bls.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "backends/python_backend.h"
#include "core/bls_chain.h"
#include "core/thread.h"
#include "python/bridge.h"
#include "server/infer.h"
#include "server/server.h"
#include "server/validate.h"

typedef struct part_s {
    struct part_s *next;
    oi_response_t resp;
} part_t;

/* One call. Two references: the Python object's and, once queued, the job's (dropped after
 * `done`). Everything below `mu` is guarded by it. */
typedef struct {
    oi_job_t job; /* first: `done` gets it */
    atomic_int refs;
    oi_model_t *model; /* one reference */
    oi_request_t req;
    const char **names; /* the outputs to produce (from validation) */
    char **strings;     /* the input and output names, the id, the parameters: owned */
    uint32_t n_strings;
    int counted;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    part_t *head, **tail;
    int ended;       /* `done` came */
    oi_status_t *st; /* its failure, taken by the caller */
    int efd;         /* eventfd written at each response and at the end; -1 until asked */
    int wake_fd;     /* a worker's calls' eventfd (not owned), written likewise; -1 once released */
    char *chain;     /* a worker's call: its bls_chain, owned */
} bls_t;

typedef struct {
    PyObject_HEAD
    bls_t *b;
    PyObject *parameters; /* the parameters (JSON text) of the response next() gave last, or None */
    int final;            /* that response came with the target's final flag */
} BlsCallObject;

static void bls_unref(bls_t *b)
{
    if (atomic_fetch_sub(&b->refs, 1) != 1)
        return;
    for (part_t *p = b->head, *n; p != NULL; p = n) {
        n = p->next;
        oi_response_clear(&p->resp);
        free(p);
    }
    oi_request_clear(&b->req);
    oi_response_clear(&b->job.resp);
    oi_status_free(b->job.status);
    oi_status_free(b->st);
    free(b->names);
    for (uint32_t i = 0; i < b->n_strings; i++)
        free(b->strings[i]);
    free(b->strings);
    free(b->chain);
    if (b->model != NULL)
        oi_model_unref(b->model);
    if (b->efd >= 0)
        close(b->efd);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

/* Under b->mu: wakes the caller, blocked in next() or waiting on the eventfd. */
static void wake(bls_t *b)
{
    pthread_cond_broadcast(&b->cv);
    uint64_t one = 1;
    ssize_t w = 0; /* a full counter is still readable */
    if (b->efd >= 0)
        w = write(b->efd, &one, sizeof(one));
    if (b->wake_fd >= 0)
        w = write(b->wake_fd, &one, sizeof(one));
    (void)w;
}

/* A decoupled target's response, on its executor: kept in order for the caller. */
static oi_status_t *bls_send(void *arg, oi_response_t *resp)
{
    bls_t *b = arg;
    if (atomic_load(&b->job.cancelled))
        return oi_status_new(OI_CLIENT_CLOSED, "the BLS request was cancelled");
    part_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    oi_response_drop_absent(resp); /* the caller sees the outputs the response has */
    p->resp = *resp;
    memset(resp, 0, sizeof(*resp));
    pthread_mutex_lock(&b->mu);
    *b->tail = p;
    b->tail = &p->next;
    wake(b);
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* On the target's executor (or this thread for a job refused at once). */
static void bls_done(oi_job_t *j)
{
    bls_t *b = (bls_t *)j;
    if (j->status == NULL && !b->model->decoupled)
        j->status = oi_validate_response(b->model, j->output_names, j->n_outputs, &j->resp);
    if (j->counted && j->slot != NULL)
        oi_stats_request(j->slot, &j->times, oi_now_ns(), j->status == NULL,
                         j->times.compute_start       ? OI_FAIL_BACKEND
                         : atomic_load(&j->cancelled) ? OI_FAIL_CANCELED
                                                      : OI_FAIL_REJECTED,
                         j->rows);
    part_t *p = NULL;
    if (j->status == NULL && !b->model->decoupled && (p = calloc(1, sizeof(*p))) == NULL)
        j->status = oi_status_new(OI_INTERNAL, "out of memory");
    pthread_mutex_lock(&b->mu);
    if (p != NULL) {
        p->resp = j->resp;
        memset(&j->resp, 0, sizeof(j->resp));
        *b->tail = p;
        b->tail = &p->next;
    }
    b->st = j->status;
    j->status = NULL;
    b->ended = 1;
    wake(b);
    pthread_mutex_unlock(&b->mu);
    bls_unref(b);
}

static char *keep(bls_t *b, const char *s)
{
    char *c = strdup(s);
    if (c != NULL)
        b->strings[b->n_strings++] = c;
    return c;
}

static uint64_t request_rows(const oi_model_t *m, const oi_request_t *req)
{
    if (m->max_batch_size <= 0 || req->n_inputs == 0 || req->inputs[0].ndim < 1 || req->inputs[0].shape[0] < 1)
        return 1;
    return (uint64_t)req->inputs[0].shape[0];
}

/* Builds the request over the arrays; NULL, or the status that refuses it (a Python error set
 * where the arguments themselves are wrong: returns NULL then too, with *pyerr). */
static oi_status_t *build(bls_t *b, PyObject *inputs, PyObject *outputs, const char *id, const char *params,
                          int *pyerr)
{
    Py_ssize_t n_in = PyList_GET_SIZE(inputs), n_out = PyList_GET_SIZE(outputs);
    /* The names, then the id, the parameters, the sequence id string and the call chain. */
    b->strings = calloc((size_t)(n_in + n_out + 4), sizeof(char *));
    b->req.inputs = calloc(n_in ? (size_t)n_in : 1, sizeof(*b->req.inputs));
    b->req.outputs = calloc(n_out ? (size_t)n_out : 1, sizeof(*b->req.outputs));
    if (b->strings == NULL || b->req.inputs == NULL || b->req.outputs == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    for (Py_ssize_t i = 0; i < n_in; i++) {
        const char *name, *dtype;
        PyObject *array;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(inputs, i), "ssO", &name, &dtype, &array)) {
            *pyerr = 1;
            return NULL;
        }
        oi_dtype_t t = oi_dtype_from_name(dtype, strlen(dtype));
        if (t == OI_TYPE_INVALID)
            return oi_status_new(OI_BAD_REQUEST, "input '%s': datatype '%s' is not a Triton datatype", name, dtype);
        const char *kept = keep(b, name);
        if (kept == NULL)
            return oi_status_new(OI_INTERNAL, "out of memory");
        oi_tensor_t *tensor = &b->req.inputs[b->req.n_inputs];
        oi_status_t *st = oi_py_to_tensor(array, t, "input", kept, tensor);
        if (st != NULL)
            return st;
        tensor->name = kept;
        b->req.n_inputs++;
    }
    for (Py_ssize_t i = 0; i < n_out; i++) {
        const char *name = PyUnicode_AsUTF8(PyList_GET_ITEM(outputs, i));
        if (name == NULL) {
            *pyerr = 1;
            return NULL;
        }
        const char *kept = keep(b, name);
        if (kept == NULL)
            return oi_status_new(OI_INTERNAL, "out of memory");
        b->req.outputs[b->req.n_outputs].name = kept;
        b->req.outputs[b->req.n_outputs++].binary_data = -1;
    }
    if (id != NULL && id[0] != '\0') {
        if ((b->req.id = keep(b, id)) == NULL)
            return oi_status_new(OI_INTERNAL, "out of memory");
        b->req.id_len = strlen(id);
    }
    if (params != NULL && params[0] != '\0' && strcmp(params, "{}") != 0) {
        const char *kept = keep(b, params);
        if (kept == NULL)
            return oi_status_new(OI_INTERNAL, "out of memory");
        b->req.parameters = (oi_slice_t){.ptr = kept, .len = strlen(kept)};
    }
    return NULL;
}

/* Finds the model, checks the request and queues it. NULL when queued (or run already). A caller
 * that waits for the answer on a Python model's executor (`on_caller`) may run a quick target
 * itself, when its scheduler has nothing queued (oi_scheduler_submit_on_caller). */
static oi_status_t *submit(bls_t *b, oi_registry_t *reg, const char *model, const char *version, int on_caller)
{
    oi_status_t *st = NULL;
    b->model = oi_registry_find(reg, model, version, &st);
    if (b->model == NULL)
        return st;
    if ((st = oi_model_check_ready(b->model)) != NULL)
        return st;
    uint32_t *classes = NULL;
    st = oi_validate_request(b->model, &b->req, &b->names, &b->job.n_outputs, &classes);
    free(classes); /* none asked */
    if (st != NULL)
        return st;
    b->job.req = &b->req;
    b->job.output_names = b->names;
    b->job.done = bls_done;
    b->job.counted = b->counted;
    b->job.rows = request_rows(b->model, &b->req);
    b->req.cancelled = oi_job_cancelled;
    b->req.cancelled_arg = &b->job;
    if (b->model->decoupled) {
        b->req.send = bls_send;
        b->req.send_arg = b;
    }
    atomic_fetch_add(&b->refs, 1); /* the job's, dropped by bls_done */
    if (b->model->seq != NULL) {
        st = oi_seq_submit(b->model->seq, &b->job);
    } else if ((on_caller && !b->model->decoupled ? oi_scheduler_submit_on_caller(b->model->sched, &b->job)
                                                   : oi_scheduler_submit(b->model->sched, &b->job)) < 0) {
        st = oi_status_new(OI_UNAVAILABLE, "the server is shutting down");
    }
    if (st != NULL)
        atomic_fetch_sub(&b->refs, 1); /* nothing queued: `done` never comes */
    return st;
}

static bls_t *bls_new(int counted)
{
    bls_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    atomic_init(&b->refs, 1);
    atomic_init(&b->job.cancelled, 0);
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->tail = &b->head;
    b->efd = -1;
    b->wake_fd = -1;
    b->counted = counted;
    b->req.binary_data_output = -1;
    return b;
}

void *oi_py_bls_worker_start(void *ctx, const char *model, const char *version, oi_request_t *req, uint32_t flags,
                             int wake_fd, oi_status_t **st)
{
    oi_server_t *s = ctx;
    bls_t *b = bls_new(oi_server_counts_statistics(s));
    if (b == NULL) {
        *st = oi_status_new(OI_INTERNAL, "out of memory");
        return NULL;
    }
    b->req = *req;
    memset(req, 0, sizeof(*req));
    if (b->req.bls_chain != NULL && (b->req.bls_chain = b->chain = strdup(b->req.bls_chain)) == NULL) {
        *st = oi_status_new(OI_INTERNAL, "out of memory");
        bls_unref(b);
        return NULL;
    }
    b->wake_fd = wake_fd; /* before it is queued: a request refused in submit ends at once */
    *st = submit(b, oi_server_registry(s), model, version, 0);
    if (b->model != NULL && b->model->decoupled && !(flags & OI_PW_BLS_DECOUPLED)) { /* as exec() says */
        oi_status_free(*st);
        *st = oi_status_new(OI_INTERNAL,
                            "Model %s is using the decoupled. The current BLS request call doesn't support models "
                            "using the decoupled transaction policy. Please use 'decoupled=True' argument to the "
                            "'exec' or 'async_exec' calls for decoupled models.'",
                            model);
    }
    if (*st != NULL) {
        oi_py_bls_worker_release(b);
        return NULL;
    }
    return b;
}

int oi_py_bls_worker_next(void *call, oi_response_t *resp, oi_status_t **st)
{
    bls_t *b = call;
    pthread_mutex_lock(&b->mu);
    part_t *p = b->head;
    if (p != NULL && (b->head = p->next) == NULL)
        b->tail = &b->head;
    int got = p != NULL ? 1 : b->ended ? 0 : -1;
    if (got == 0) {
        *st = b->st;
        b->st = NULL;
    }
    pthread_mutex_unlock(&b->mu);
    if (p != NULL) {
        *resp = p->resp;
        free(p);
    }
    return got;
}

void oi_py_bls_worker_cancel(void *call) { oi_job_cancel(&((bls_t *)call)->job); }

void oi_py_bls_worker_release(void *call)
{
    bls_t *b = call;
    pthread_mutex_lock(&b->mu);
    b->wake_fd = -1; /* the worker's eventfd may close once this returns */
    pthread_mutex_unlock(&b->mu);
    oi_job_cancel(&b->job);
    bls_unref(b);
}

PyObject *oi_py_bls_start(oi_registry_t *reg, int counted, PyObject *args, PyObject *kwargs)
{
    static char *kw[] = {"model", "version", "inputs", "outputs", "request_id", "parameters", "timeout_us",
                         "sequence_id", "sequence_id_str", "sequence_start", "sequence_end", "caller", "chain", NULL};
    const char *model, *version, *id = NULL, *params = NULL, *seq_str = NULL, *caller = NULL, *chain = NULL;
    PyObject *inputs, *outputs;
    unsigned long long timeout_us = 0, seq_id = 0;
    int seq_start = 0, seq_end = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ssO!O!|zzKKzppzz", kw, &model, &version, &PyList_Type, &inputs,
                                     &PyList_Type, &outputs, &id, &params, &timeout_us, &seq_id, &seq_str,
                                     &seq_start, &seq_end, &caller, &chain))
        return NULL;
    bls_t *b = bls_new(counted);
    BlsCallObject *self = b != NULL ? PyObject_New(BlsCallObject, &oi_py_bls_type) : NULL;
    if (self == NULL) {
        if (b != NULL)
            bls_unref(b);
        return PyErr_NoMemory();
    }
    b->req.timeout_us = timeout_us;
    b->req.seq.id = seq_id;
    b->req.seq.start = (uint8_t)seq_start;
    b->req.seq.end = (uint8_t)seq_end;
    self->b = b;
    self->parameters = NULL;
    self->final = 0;
    int pyerr = 0;
    oi_status_t *st = build(b, inputs, outputs, id, params, &pyerr);
    if (pyerr) {
        Py_DECREF(self);
        return NULL;
    }
    if (st == NULL && seq_str != NULL && seq_str[0] != '\0') {
        if ((b->req.seq.id_str = keep(b, seq_str)) == NULL)
            st = oi_status_new(OI_INTERNAL, "out of memory");
        b->req.seq.id_str_len = strlen(seq_str);
    }
    if (st == NULL && caller != NULL) { /* a model's call: it and those up its chain wait for it */
        char *extended = NULL;
        if ((st = oi_bls_chain_extend(chain, caller, model, &extended)) == NULL &&
            (b->req.bls_chain = keep(b, extended)) == NULL)
            st = oi_status_new(OI_INTERNAL, "out of memory");
        free(extended);
    }
    if (st == NULL) {
        int on_caller = oi_python_backend_on_executor();
        Py_BEGIN_ALLOW_THREADS /* a full queue refuses at once, calling `done` here */
        st = submit(b, reg, model, version, on_caller);
        Py_END_ALLOW_THREADS
    }
    if (st != NULL) { /* refused before it was queued: the call ends with that error */
        pthread_mutex_lock(&b->mu);
        b->st = st;
        b->ended = 1;
        pthread_mutex_unlock(&b->mu);
    }
    return (PyObject *)self;
}

static void Bls_dealloc(BlsCallObject *self)
{
    if (self->b != NULL) {
        oi_job_cancel(&self->b->job); /* nobody waits for it any more */
        bls_unref(self->b);
    }
    Py_XDECREF(self->parameters);
    PyObject_Free(self);
}

/* next(timeout=-1): the next response as {name: array} (the arrays view the target's
 * outputs); None once the call has ended well; (status, message) when it ended with an error;
 * False when `timeout` seconds passed first (< 0: wait as long as it takes). */
static PyObject *Bls_next(BlsCallObject *self, PyObject *args)
{
    double timeout = -1;
    if (!PyArg_ParseTuple(args, "|d", &timeout))
        return NULL;
    bls_t *b = self->b;
    part_t *p = NULL;
    int ended = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&b->mu);
    if (timeout >= 0 && b->head == NULL && !b->ended) {
        struct timespec ts = oi_deadline_in(timeout);
        while (b->head == NULL && !b->ended)
            if (pthread_cond_timedwait(&b->cv, &b->mu, &ts) == ETIMEDOUT)
                break;
    } else {
        while (b->head == NULL && !b->ended)
            pthread_cond_wait(&b->cv, &b->mu);
    }
    if ((p = b->head) != NULL) {
        b->head = p->next;
        if (b->head == NULL)
            b->tail = &b->head;
    }
    ended = b->ended;
    pthread_mutex_unlock(&b->mu);
    Py_END_ALLOW_THREADS
    if (p == NULL && !ended)
        Py_RETURN_FALSE;
    if (p == NULL) {
        if (b->st == NULL)
            Py_RETURN_NONE;
        return Py_BuildValue("(is)", b->st->code, b->st->message);
    }
    PyObject *out = PyDict_New();
    for (uint32_t i = 0; out != NULL && i < p->resp.n_outputs; i++) {
        const oi_tensor_t *t = &p->resp.outputs[i];
        PyObject *array = oi_py_array_view(t, 0);
        PyObject *pair = array != NULL ? Py_BuildValue("(sN)", oi_dtype_name(t->dtype), array) : NULL;
        if (pair == NULL || PyDict_SetItemString(out, t->name, pair) < 0)
            Py_CLEAR(out);
        Py_XDECREF(pair);
    }
    const oi_buf_t *params = p->resp.parameters;
    Py_XSETREF(self->parameters, params != NULL ? PyUnicode_FromStringAndSize(params->data, (Py_ssize_t)params->len)
                                                : Py_NewRef(Py_None));
    if (self->parameters == NULL)
        Py_CLEAR(out);
    self->final = p->resp.final;
    oi_response_clear(&p->resp);
    free(p);
    return out;
}

/* fileno(): an eventfd that becomes readable at each response and at the end (for an
 * asyncio loop's add_reader); the caller reads it before it calls next(0). */
static PyObject *Bls_fileno(BlsCallObject *self, PyObject *Py_UNUSED(ignored))
{
    bls_t *b = self->b;
    pthread_mutex_lock(&b->mu);
    if (b->efd < 0) {
        b->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (b->efd >= 0 && (b->head != NULL || b->ended))
            wake(b);
    }
    int fd = b->efd;
    pthread_mutex_unlock(&b->mu);
    if (fd < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(fd);
}

/* cancel(): the caller no longer wants the answer (its own client went): a queued request is
 * dropped unrun, a running one sees its cancelled flag; the call still ends. */
static PyObject *Bls_cancel(BlsCallObject *self, PyObject *Py_UNUSED(ignored))
{
    oi_job_cancel(&self->b->job);
    Py_RETURN_NONE;
}

static PyObject *Bls_decoupled(BlsCallObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->b->model != NULL && self->b->model->decoupled);
}

static PyMethodDef Bls_methods[] = {
    {"next", (PyCFunction)Bls_next, METH_VARARGS,
     "next(timeout=-1) -> {name: (datatype, array)} | None (ended) | (status, message) | False (timed out)"},
    {"fileno", (PyCFunction)Bls_fileno, METH_NOARGS, "An eventfd readable at each response and at the end."},
    {"cancel", (PyCFunction)Bls_cancel, METH_NOARGS, "Cancels the call (its client has gone)."},
    {NULL, NULL, 0, NULL},
};

static PyObject *Bls_parameters(BlsCallObject *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->parameters != NULL ? self->parameters : Py_None);
}

static PyObject *Bls_final(BlsCallObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(self->final);
}

static PyGetSetDef Bls_getset[] = {
    {"decoupled", (getter)Bls_decoupled, NULL, "Whether the target model is decoupled.", NULL},
    {"parameters", (getter)Bls_parameters, NULL,
     "The parameters (JSON text) of the response next() returned last; None when it had none.", NULL},
    {"final", (getter)Bls_final, NULL, "Whether the target's final flag came with that response.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject oi_py_bls_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "openinfer._core.BlsCall",
    .tp_basicsize = sizeof(BlsCallObject),
    .tp_dealloc = (destructor)Bls_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An inference a model made on its own server (BLS): Server.bls(...) makes one.",
    .tp_methods = Bls_methods,
    .tp_getset = Bls_getset,
};
