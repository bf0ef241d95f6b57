/* The worker end of a Python model's process instance (the server end is
 * backends/process_backend.c, the wire backends/process_wire.h): a request is rebuilt over
 * the job area without copying, run through the very Python backend that serves in-process
 * models (so conversions and error wording are the same), and its outputs are written into
 * the result ring: the one copy a result makes on its way to the server. */
#include "python/worker.h"

#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backends/process_wire.h"
#include "backends/python_backend.h"
#include "python/triton_execute.h"
#include "core/thread.h"
#include "python/worker_mux.h"

/* The result ring: only this process carves blocks (head) and reclaims them (tail); the
 * server frees a block by flag once the response that holds it is sent. */
typedef struct ring_s {
    char *base;
    size_t size;
    uint64_t head, tail; /* running byte counts; offsets are these modulo size */
} ring_t;

typedef struct worker_s {
    int sock;
    oi_buf_t *jobs; /* the job area's current mapping; input tensors hold references to it */
    ring_t ring;
    const char *const *names; /* the running job's requested outputs */
    uint32_t n_names;
} worker_t;

static void unmap_release(oi_buf_t *b)
{
    munmap(b->data, b->len);
    free(b);
}

/* Maps the job area at its current size. A model that kept an input array keeps the old
 * mapping alive; the new job's bytes are elsewhere in the same memfd. */
static int map_jobs(worker_t *w, size_t len)
{
    if (w->jobs != NULL && w->jobs->len >= len)
        return 0;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, OI_PW_FD_JOBS, 0);
    if (p == MAP_FAILED)
        return -1;
    oi_buf_t *b = oi_buf_wrap(p, len, unmap_release, NULL);
    if (b == NULL) {
        munmap(p, len);
        return -1;
    }
    oi_buf_unref(w->jobs);
    w->jobs = b;
    return 0;
}

static char *ring_alloc(ring_t *r, uint64_t need, uint64_t *offset)
{
    while (r->tail < r->head) {
        oi_pw_block_t *b = (oi_pw_block_t *)(r->base + r->tail % r->size);
        if (atomic_load_explicit(&b->state, memory_order_acquire) != OI_PW_BLOCK_FREE)
            break;
        r->tail += b->size;
    }
    uint64_t at = r->head % r->size;
    uint64_t skip = at + need > r->size ? r->size - at : 0; /* a block never wraps */
    if (need > r->size || r->head + skip + need - r->tail > r->size)
        return NULL;
    if (skip > 0) {
        oi_pw_block_t *b = (oi_pw_block_t *)(r->base + at);
        b->size = skip;
        b->n_outputs = 0;
        atomic_store_explicit(&b->state, OI_PW_BLOCK_FREE, memory_order_relaxed);
        r->head += skip;
        at = 0;
    }
    r->head += need;
    *offset = at;
    return r->base + at;
}

static int send_reply(worker_t *w, uint32_t type, uint32_t flags, uint64_t block, int fd)
{
    oi_pw_reply_t r = {.type = type, .flags = flags, .block = block};
    oi_pw_fds_t with = {.fd = {fd}, .n = fd >= 0};
    return oi_pw_send(w->sock, &r, sizeof(r), &with);
}

/* OI_PW_ERROR, or OI_PW_FAIL_ONE for request `k` of a batch. */
static int send_error_as(int sock, uint32_t type, uint64_t k, int code, const char *text)
{
    char buf[OI_PW_MAX_MESSAGE];
    oi_pw_reply_t r = {.type = type, .code = (uint32_t)code, .block = k};
    size_t len = strlen(text);
    if (len > sizeof(buf) - sizeof(r))
        len = sizeof(buf) - sizeof(r);
    memcpy(buf, &r, sizeof(r));
    memcpy(buf + sizeof(r), text, len);
    return oi_pw_send(sock, buf, sizeof(r) + len, NULL);
}

static int send_error(int sock, int code, const char *text) { return send_error_as(sock, OI_PW_ERROR, 0, code, text); }

/* Request k's own response parameters (oi_request_t.batch_resp_params), in pieces that fit a
 * message. */
static int send_parameters(int sock, uint64_t k, const oi_buf_t *params)
{
    char buf[OI_PW_MAX_MESSAGE];
    oi_pw_reply_t r = {.type = OI_PW_PARAMS_ONE, .block = k};
    memcpy(buf, &r, sizeof(r));
    int rc = 0;
    for (size_t off = 0; off < params->len && rc == 0;) {
        size_t len = params->len - off < sizeof(buf) - sizeof(r) ? params->len - off : sizeof(buf) - sizeof(r);
        memcpy(buf + sizeof(r), params->data + off, len);
        rc = oi_pw_send(sock, buf, sizeof(r) + len, NULL);
        off += len;
    }
    return rc;
}

/* Writes a response's outputs as one block, in the ring or (when it does not fit there) in a
 * memfd of its own, and sends `type` naming it. */
static int send_outputs(worker_t *w, uint32_t type, const oi_response_t *resp)
{
    uint64_t need = oi_pw_align(sizeof(oi_pw_block_t) + resp->n_outputs * sizeof(oi_pw_tensor_t));
    for (uint32_t i = 0; i < resp->n_outputs; i++)
        need += oi_pw_align(resp->outputs[i].byte_size);
    uint64_t params_len = resp->parameters != NULL ? resp->parameters->len : 0;
    need += oi_pw_align(params_len);
    uint64_t offset = 0;
    int fd = -1;
    char *p = ring_alloc(&w->ring, need, &offset);
    if (p == NULL) {
        fd = memfd_create("openinfer-result", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)need) != 0 ||
            (p = mmap(NULL, need, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
            if (fd >= 0)
                close(fd);
            return send_error(w->sock, OI_INTERNAL, "cannot make shared memory for the model's result");
        }
    }
    oi_pw_block_t *block = (oi_pw_block_t *)p;
    block->size = need;
    block->n_outputs = resp->n_outputs;
    oi_pw_tensor_t *d = (oi_pw_tensor_t *)(block + 1);
    uint64_t data = oi_pw_align(sizeof(oi_pw_block_t) + resp->n_outputs * sizeof(oi_pw_tensor_t));
    for (uint32_t i = 0; i < resp->n_outputs; i++) {
        const oi_tensor_t *t = &resp->outputs[i];
        d[i] = (oi_pw_tensor_t){.dtype = t->dtype, .ndim = t->absent ? OI_PW_ABSENT : t->ndim, .offset = data,
                                .byte_size = t->byte_size};
        memcpy(d[i].shape, t->shape, sizeof(d[i].shape));
        if (t->byte_size > 0)
            memcpy(p + data, t->data, t->byte_size);
        data += oi_pw_align(t->byte_size);
    }
    block->params_offset = data;
    block->params_len = params_len;
    block->final = resp->final;
    if (params_len > 0)
        memcpy(p + data, resp->parameters->data, params_len);
    atomic_store_explicit(&block->state, OI_PW_BLOCK_LIVE, memory_order_release);
    int rc = send_reply(w, type, fd >= 0 ? OI_PW_IN_MEMFD : 0, offset, fd);
    if (fd >= 0) {
        munmap(p, need);
        close(fd);
    }
    return rc;
}

static int job_cancelled(const void *arg)
{
    const worker_t *w = arg;
    const oi_pw_shared_t *shared = (const oi_pw_shared_t *)w->jobs->data;
    return atomic_load_explicit(&shared->cancelled, memory_order_relaxed) != 0;
}

/* A decoupled model's response: to the server, then wait for its word that it went out. One
 * at a time (the model's threads may send at once): each answer is the last response's. */
static oi_status_t *send_partial(void *arg, oi_response_t *resp)
{
    static pthread_mutex_t one_at_a_time = PTHREAD_MUTEX_INITIALIZER;
    worker_t *w = arg;
    pthread_mutex_lock(&one_at_a_time);
    int rc = send_outputs(w, OI_PW_PARTIAL, resp);
    uint32_t answer = rc == 0 ? oi_wm_answer() : OI_PW_STOP;
    pthread_mutex_unlock(&one_at_a_time);
    oi_response_clear(resp);
    if (answer == OI_PW_ACK)
        return NULL;
    return oi_status_new(OI_CLIENT_CLOSED, "the response could not be sent");
}

/* Maps an input that stays in the server's memory (read only: it is the client's request):
 * the pages that hold it, prefaulted in one call rather than one fault per page. */
static const char *map_input(int fd, const oi_pw_tensor_t *d, oi_tensor_t *t)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0 || d->offset > (uint64_t)sb.st_size || d->byte_size > (uint64_t)sb.st_size - d->offset)
        return "shared input out of bounds";
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), start = d->offset & ~(page - 1);
    size_t len = (size_t)(d->offset + d->byte_size - start);
    void *p = mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, (off_t)start);
    if (p == MAP_FAILED)
        return "cannot map a shared input";
    if ((t->owner = oi_buf_wrap(p, len, unmap_release, NULL)) == NULL) {
        munmap(p, len);
        return "out of memory";
    }
    t->data = (char *)p + (d->offset - start);
    return NULL;
}

/* One id of the job area (see oi_pw_request_t): *id points at it, or is NULL for none. Returns
 * where the next field starts, or NULL when the id runs past `end`. */
static const char *read_id(const char *at, const char *end, const char **id)
{
    uint32_t len;
    if (at + 4 > end)
        return NULL;
    memcpy(&len, at, 4);
    if (len > (size_t)(end - at) - 4 || (len > 0 && at[4 + len - 1] != '\0'))
        return NULL;
    *id = len ? at + 4 : NULL;
    return at + ((4 + (size_t)len + 7) & ~(size_t)7);
}

/* Rebuilds the request the job area describes; its tensors point into the area or into the
 * memfds that came with the job. NULL, or why the descriptor is unsound (a bug on one side of
 * the wire: never the client's). */
static const char *read_job(worker_t *w, const oi_pw_fds_t *fds, oi_request_t *req, const char ***names)
{
    const char *base = w->jobs->data, *end = base + w->jobs->len;
    const char *at = base + OI_PW_DESC_OFFSET;
    oi_pw_request_t head;
    memcpy(&head, at, sizeof(head));
    at += sizeof(head);
    if ((req->inputs = calloc(head.n_inputs ? head.n_inputs : 1, sizeof(oi_tensor_t))) == NULL ||
        (*names = calloc(head.n_outputs ? head.n_outputs : 1, sizeof(char *))) == NULL)
        return "out of memory";
    for (uint32_t i = 0; i < head.n_inputs; i++) {
        oi_pw_tensor_t d;
        if (at + sizeof(d) > end)
            return "input descriptor out of bounds";
        memcpy(&d, at, sizeof(d));
        at += sizeof(d);
        if (d.ndim < 0 || d.ndim > OI_MAX_DIMS || at + d.name_len + 1 > end || d.area > fds->n ||
            (d.area == 0 && (d.offset > w->jobs->len || d.byte_size > w->jobs->len - d.offset)))
            return "input descriptor malformed";
        oi_tensor_t *t = &req->inputs[i];
        t->name = at;
        at += (d.name_len + 8) & ~(size_t)7;
        t->dtype = (oi_dtype_t)d.dtype;
        t->ndim = d.ndim;
        memcpy(t->shape, d.shape, sizeof(t->shape));
        t->byte_size = d.byte_size;
        if (d.area == 0) {
            t->data = (char *)base + d.offset;
            t->owner = oi_buf_ref(w->jobs);
        } else {
            const char *bad = map_input(fds->fd[d.area - 1], &d, t);
            if (bad != NULL)
                return bad;
        }
        req->n_inputs = i + 1;
    }
    for (uint32_t i = 0; i < head.n_outputs; i++) {
        uint32_t len;
        if (at + 4 > end)
            return "output name out of bounds";
        memcpy(&len, at, 4);
        if (at + 4 + len + 1 > end)
            return "output name out of bounds";
        (*names)[i] = at + 4;
        at += 4 + ((len + 8) & ~(size_t)7);
    }
    if (head.has_params) {
        if (at + head.params_len > end)
            return "parameters out of bounds";
        req->parameters.ptr = at;
        req->parameters.len = head.params_len;
    }
    at += (head.params_len + 7) & ~(size_t)7;
    if ((at = read_id(at, end, &req->id)) == NULL)
        return "request id out of bounds";
    if (head.n_batch == 0)
        return NULL;
    int64_t *rows = calloc(head.n_batch, sizeof(*rows));
    const char **ids = calloc(head.n_batch, sizeof(*ids));
    req->batch_rows = rows; /* freed by serve(), whatever happens next */
    req->batch_ids = ids;
    if (rows == NULL || ids == NULL)
        return "out of memory";
    if (at + head.n_batch * sizeof(int64_t) > end)
        return "batch rows out of bounds";
    memcpy(rows, at, head.n_batch * sizeof(int64_t));
    at += head.n_batch * sizeof(int64_t);
    for (uint32_t k = 0; k < head.n_batch; k++)
        if ((at = read_id(at, end, &ids[k])) == NULL)
            return "batch ids out of bounds";
    oi_slice_t *params = calloc(head.n_batch, sizeof(*params));
    oi_status_t **errors = calloc(head.n_batch, sizeof(*errors));
    oi_buf_t **resp_params = calloc(head.n_batch, sizeof(*resp_params));
    uint8_t *absent = calloc((size_t)head.n_batch * (head.n_outputs ? head.n_outputs : 1), 1);
    req->batch_params = params; /* freed by serve() too */
    req->batch_errors = errors;
    req->batch_resp_params = resp_params;
    req->batch_absent = absent;
    if (params == NULL || errors == NULL || resp_params == NULL || absent == NULL)
        return "out of memory";
    for (uint32_t k = 0; k < head.n_batch; k++) {
        const char *text;
        const char *next = read_id(at, end, &text);
        if (next == NULL)
            return "batch parameters out of bounds";
        uint32_t len;
        memcpy(&len, at, 4);
        params[k] = (oi_slice_t){text, len ? len - 1 : 0};
        at = next;
    }
    req->n_batch = head.n_batch;
    return NULL;
}

/* Serves jobs until the server closes the socket. Runs without the GIL; the Python backend
 * takes it around the model's call, as on a server's executor thread. */
static void serve(worker_t *w, void *state)
{
    for (;;) {
        oi_pw_job_t job;
        oi_pw_fds_t fds;
        if (oi_wm_next_job(&job, &fds) != 0)
            return; /* the server has gone (or broke the wire): nothing left to serve */
        if (map_jobs(w, job.area_len) != 0) {
            oi_pw_close_fds(&fds);
            send_error(w->sock, OI_INTERNAL, "cannot map the job area");
            continue;
        }
        oi_request_t req = {0};
        const char **names = NULL;
        const char *bad = read_job(w, &fds, &req, &names);
        oi_pw_close_fds(&fds); /* the inputs' mappings keep what they need */
        uint32_t n_names = bad == NULL ? ((const oi_pw_request_t *)(w->jobs->data + OI_PW_DESC_OFFSET))->n_outputs : 0;
        req.cancelled = job_cancelled;
        req.cancelled_arg = w;
        if (job.flags & OI_PW_JOB_DECOUPLED) {
            req.send = send_partial;
            req.send_arg = w;
        }
        oi_response_t resp = {0};
        oi_wm_job_begin(bad == NULL ? &req : NULL);
        oi_status_t *st = bad != NULL ? oi_status_new(OI_INTERNAL, "worker: %s", bad)
                                      : oi_python_backend.execute(state, &req, names, n_names, &resp);
        oi_wm_job_end(); /* before the job's last message: a BLS naming its inputs went before */
        int rc = 0;
        for (uint32_t k = 0; req.batch_errors != NULL && k < req.n_batch && rc == 0; k++)
            if (req.batch_errors[k] != NULL) /* before the RESULT or ERROR, which ends the job */
                rc = send_error_as(w->sock, OI_PW_FAIL_ONE, k, req.batch_errors[k]->code, req.batch_errors[k]->message);
        for (uint32_t k = 0; req.batch_resp_params != NULL && k < req.n_batch && rc == 0; k++)
            if (req.batch_resp_params[k] != NULL && req.batch_resp_params[k]->len > 0)
                rc = send_parameters(w->sock, k, req.batch_resp_params[k]);
        for (size_t at = 0; req.batch_absent != NULL && at < (size_t)req.n_batch * n_names && rc == 0; at++)
            if (req.batch_absent[at])
                rc = send_error_as(w->sock, OI_PW_ABSENT_ONE, at / n_names, (int)(at % n_names), "");
        if (rc == 0 && st != NULL)
            rc = send_error(w->sock, st->code, st->message);
        else if (rc == 0 && req.send != NULL)
            rc = send_reply(w, OI_PW_DONE, 0, 0, -1);
        else if (rc == 0)
            rc = send_outputs(w, OI_PW_RESULT, &resp);
        oi_status_free(st);
        oi_response_clear(&resp);
        for (uint32_t i = 0; i < req.n_inputs; i++)
            oi_tensor_clear(&req.inputs[i]);
        free(req.inputs);
        free((void *)req.batch_rows);
        free((void *)req.batch_ids);
        free((void *)req.batch_params);
        for (uint32_t k = 0; req.batch_errors != NULL && k < req.n_batch; k++)
            oi_status_free(req.batch_errors[k]);
        free(req.batch_errors);
        for (uint32_t k = 0; req.batch_resp_params != NULL && k < req.n_batch; k++)
            oi_buf_unref(req.batch_resp_params[k]);
        free(req.batch_resp_params);
        free(req.batch_absent);
        free(names);
        if (rc != 0)
            return;
    }
}

/* Ends this process when the server process `parent` ends (a thread of its own waits on a
 * pidfd of it, or looks every 200 ms on kernels before 5.3). Not PR_SET_PDEATHSIG: that fires
 * when the *thread* that started the worker ends, and a load's control thread ends with the
 * load. 0, or -1 when the server is already gone. */
static void *parent_watch(void *arg)
{
    pid_t parent = (pid_t)(intptr_t)arg;
    int fd = (int)syscall(SYS_pidfd_open, parent, 0);
    if (fd >= 0) {
        struct pollfd pfd = {fd, POLLIN, 0};
        while (poll(&pfd, 1, -1) <= 0) /* readable once the server has exited */
            ;
    } else { /* no pidfd (or the server is already gone): its exit makes us someone else's */
        while (getppid() == parent)
            usleep(200 * 1000);
    }
    _exit(1);
    return NULL;
}

static int watch_parent(pid_t parent)
{
    pthread_t t;
    if (getppid() != parent)
        return -1;
    return oi_thread_create(&t, "oi-parent-watch", parent_watch, (void *)(intptr_t)parent, 1) == 0 ? 0 : -1;
}

static PyObject *worker_serve(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"handler", "model_name", "outputs", "parent", "direct", NULL};
    PyObject *handler, *outputs, *direct = Py_None;
    const char *name;
    int parent;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsOi|$O", kwlist, &handler, &name, &outputs, &parent, &direct))
        return NULL;
    if (direct != Py_None && !PyObject_TypeCheck(direct, &oi_py_triton_execute_type)) {
        PyErr_Format(PyExc_TypeError, "worker_serve: direct must be a TritonExecute or None, got %R", direct);
        return NULL;
    }
    /* The worker must not outlive the server, even one killed outright. */
    if (watch_parent(parent) != 0)
        return PyErr_Format(PyExc_RuntimeError, "the server (pid %d) is gone", parent);
    PyObject *fast = PySequence_Fast(outputs, "outputs must be a sequence of (name, datatype)");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    oi_io_spec_t *specs = calloc(n ? (size_t)n : 1, sizeof(*specs));
    void *state = NULL;
    for (Py_ssize_t i = 0; specs != NULL && i < n; i++) {
        const char *oname, *dtype;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "ss", &oname, &dtype))
            goto done;
        specs[i].name = (char *)oname;
        specs[i].dtype = oi_dtype_from_name(dtype, strlen(dtype));
    }
    if (specs == NULL || (state = oi_python_backend_state(handler, NULL, NULL, direct != Py_None ? direct : NULL, name, specs, (uint32_t)n)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    size_t ring = (size_t)lseek(OI_PW_FD_RESULTS, 0, SEEK_END);
    worker_t w = {.sock = OI_PW_FD_SOCKET, .ring = {.size = ring}};
    w.ring.base = mmap(NULL, ring, PROT_READ | PROT_WRITE, MAP_SHARED, OI_PW_FD_RESULTS, 0);
    if (w.ring.base == MAP_FAILED) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (PyType_Ready(&oi_py_worker_call_type) < 0)
        goto done;
    if (oi_wm_start(w.sock) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    if (send_reply(&w, OI_PW_READY, 0, 0, -1) == 0) {
        Py_BEGIN_ALLOW_THREADS serve(&w, state);
        Py_END_ALLOW_THREADS
    }
    oi_buf_unref(w.jobs);
    munmap(w.ring.base, w.ring.size);
done:
    if (state != NULL)
        oi_python_backend.release(state);
    free(specs);
    Py_DECREF(fast);
    return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
}

static PyObject *worker_fail(PyObject *self, PyObject *message)
{
    (void)self;
    const char *text = PyUnicode_AsUTF8(message);
    if (text == NULL)
        return NULL;
    if (send_error(OI_PW_FD_SOCKET, OI_UNAVAILABLE, text) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

PyMethodDef oi_py_worker_functions[] = {
    {"worker_serve", (PyCFunction)(void (*)(void))worker_serve, METH_VARARGS | METH_KEYWORDS,
     "In a model's worker process: serves the server's jobs with handler(inputs, parameters, outputs, cancelled) "
     "until the server closes the socket; a Triton Python model's execute called from C with `direct` (a TritonExecute)."},
    {"worker_fail", worker_fail, METH_O, "In a model's worker process: tells the server why the model did not import."},
    {"worker_bls", oi_py_worker_bls, METH_VARARGS,
     "In a model's worker process: worker_bls(fd, job=None) sends the BLS request in memfd fd as a new call."},
    {"worker_job_inputs", oi_py_worker_job_inputs, METH_NOARGS,
     "In a model's worker process: (job, ((address, byte_size), ...)) of the running job's inputs, or None."},
    {NULL, NULL, 0, NULL},
};
