/* The worker's reader of its socket and the BLS calls it serves (worker_mux.h). One worker per
 * process: the state is this file's. Everything in `mux` is guarded by its mutex; one condition
 * wakes every waiter (a job loop, a response sender, a handful of calls), each looking for its
 * own message. */
#include "python/worker_mux.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/thread.h"

/* A response of a call, waiting in its memfd (closed once Python takes it, or with the call). */
typedef struct part_s {
    struct part_s *next;
    int fd;
} part_t;

typedef struct call_s {
    struct call_s *next; /* in mux.calls while its Python object lives */
    uint64_t id;
    part_t *head, **tail;
    int ended;  /* its BLS_END came (or the server went): code and text below */
    int code;   /* 0: ended well */
    char *text; /* the error's message */
    int efd;    /* eventfd written at each response and at the end; -1 until fileno() */
} call_t;

static struct {
    int sock;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int gone; /* the server closed the socket (or broke the wire) */
    int has_job;
    oi_pw_job_t job;
    oi_pw_fds_t job_fds;
    int has_answer;
    uint32_t answer;
    const oi_request_t *job_req; /* the job running (its inputs), NULL between jobs */
    uint64_t job_no;             /* jobs begun so far */
    call_t *calls;
    uint64_t next_id;
} mux = {.sock = -1, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* Under mux.mu: wakes the call's waiter, blocked in next() or on its eventfd. */
static void wake_call(call_t *c)
{
    pthread_cond_broadcast(&mux.cv);
    if (c->efd >= 0) {
        uint64_t one = 1;
        ssize_t w = write(c->efd, &one, sizeof(one));
        (void)w; /* a full counter is still readable */
    }
}

/* Under mux.mu: the call's end. */
static void end_call(call_t *c, int code, const char *text, size_t len)
{
    if (c->ended)
        return;
    c->ended = 1;
    c->code = code;
    c->text = code != 0 ? strndup(text, len) : NULL;
    wake_call(c);
}

static call_t *find_call(uint64_t id)
{
    for (call_t *c = mux.calls; c != NULL; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

/* Under mux.mu: a BLS_PART or BLS_END to its call; one whose caller has let go is dropped. */
static void deliver(const oi_pw_reply_t *r, const char *text, size_t len, oi_pw_fds_t *fds)
{
    call_t *c = find_call(r->block);
    part_t *p = NULL;
    if (c != NULL && !c->ended && r->type == OI_PW_BLS_PART && fds->n == 1 && (p = malloc(sizeof(*p))) != NULL) {
        p->next = NULL;
        p->fd = fds->fd[0];
        fds->n = 0; /* the part keeps it */
        *c->tail = p;
        c->tail = &p->next;
        wake_call(c);
    } else if (c != NULL && r->type == OI_PW_BLS_END) {
        end_call(c, (int)r->code, text, len);
    } else if (c != NULL && r->type == OI_PW_BLS_PART) {
        end_call(c, OI_INTERNAL, "a BLS response could not be kept", 32);
    }
    oi_pw_close_fds(fds);
}

static void *reader_main(void *arg)
{
    (void)arg;
    char buf[OI_PW_MAX_MESSAGE];
    for (;;) {
        oi_pw_fds_t fds;
        ssize_t n = oi_pw_recv(mux.sock, buf, sizeof(buf), &fds, OI_PW_MAX_FDS);
        uint32_t type = 0;
        if (n >= 4)
            memcpy(&type, buf, 4);
        pthread_mutex_lock(&mux.mu);
        if (type == OI_PW_JOB && n == (ssize_t)sizeof(oi_pw_job_t) && !mux.has_job) {
            memcpy(&mux.job, buf, sizeof(mux.job));
            mux.job_fds = fds;
            mux.has_job = 1;
            pthread_cond_broadcast(&mux.cv);
        } else if ((type == OI_PW_ACK || type == OI_PW_STOP) && n == 4 && !mux.has_answer) {
            oi_pw_close_fds(&fds);
            mux.answer = type;
            mux.has_answer = 1;
            pthread_cond_broadcast(&mux.cv);
        } else if ((type == OI_PW_BLS_PART || type == OI_PW_BLS_END) && n >= (ssize_t)sizeof(oi_pw_reply_t)) {
            deliver((const oi_pw_reply_t *)buf, buf + sizeof(oi_pw_reply_t), (size_t)n - sizeof(oi_pw_reply_t), &fds);
        } else { /* the server has gone, or broke the wire: nothing more will come */
            oi_pw_close_fds(&fds);
            mux.gone = 1;
            static const char why[] = "the server closed the worker's connection during a BLS request";
            for (call_t *c = mux.calls; c != NULL; c = c->next)
                end_call(c, OI_UNAVAILABLE, why, sizeof(why) - 1);
            pthread_cond_broadcast(&mux.cv);
            pthread_mutex_unlock(&mux.mu);
            return NULL;
        }
        pthread_mutex_unlock(&mux.mu);
    }
}

int oi_wm_start(int sock)
{
    pthread_t t;
    mux.sock = sock;
    return oi_thread_create(&t, "oi-worker-read", reader_main, NULL, 1) == 0 ? 0 : -1;
}

int oi_wm_next_job(oi_pw_job_t *job, oi_pw_fds_t *fds)
{
    pthread_mutex_lock(&mux.mu);
    while (!mux.has_job && !mux.gone)
        pthread_cond_wait(&mux.cv, &mux.mu);
    int rc = mux.has_job ? 0 : -1;
    if (mux.has_job) {
        *job = mux.job;
        *fds = mux.job_fds;
        mux.has_job = 0;
    }
    pthread_mutex_unlock(&mux.mu);
    return rc;
}

uint32_t oi_wm_answer(void)
{
    pthread_mutex_lock(&mux.mu);
    while (!mux.has_answer && !mux.gone)
        pthread_cond_wait(&mux.cv, &mux.mu);
    uint32_t answer = mux.has_answer ? mux.answer : OI_PW_STOP;
    mux.has_answer = 0;
    pthread_mutex_unlock(&mux.mu);
    return answer;
}

void oi_wm_job_begin(const oi_request_t *req)
{
    pthread_mutex_lock(&mux.mu);
    mux.job_req = req;
    mux.job_no++;
    pthread_mutex_unlock(&mux.mu);
}

void oi_wm_job_end(void)
{
    pthread_mutex_lock(&mux.mu);
    mux.job_req = NULL;
    pthread_mutex_unlock(&mux.mu);
}

/* ---- the calls, to Python ---------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    call_t *c;
} WorkerCallObject;

PyObject *oi_py_worker_job_inputs(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    pthread_mutex_lock(&mux.mu);
    const oi_request_t *req = mux.job_req;
    PyObject *inputs = req != NULL ? PyTuple_New(req->n_inputs) : NULL;
    for (uint32_t i = 0; inputs != NULL && i < req->n_inputs; i++) {
        PyObject *one = Py_BuildValue("(KK)", (unsigned long long)(uintptr_t)req->inputs[i].data,
                                      (unsigned long long)req->inputs[i].byte_size);
        if (one == NULL)
            Py_CLEAR(inputs);
        else
            PyTuple_SET_ITEM(inputs, i, one);
    }
    uint64_t job = mux.job_no;
    pthread_mutex_unlock(&mux.mu);
    if (req == NULL)
        Py_RETURN_NONE;
    return inputs != NULL ? Py_BuildValue("(KN)", (unsigned long long)job, inputs) : NULL;
}

static int send_to_server(uint32_t type, uint64_t id, int fd)
{
    oi_pw_reply_t r = {.type = type, .block = id};
    oi_pw_fds_t with = {.fd = {fd}, .n = fd >= 0};
    return oi_pw_send(mux.sock, &r, sizeof(r), &with);
}

PyObject *oi_py_worker_bls(PyObject *self, PyObject *args)
{
    int fd;
    PyObject *job = Py_None;
    (void)self;
    if (!PyArg_ParseTuple(args, "i|O", &fd, &job))
        return NULL;
    unsigned long long job_no = 0;
    if (job != Py_None && (job_no = PyLong_AsUnsignedLongLong(job)) == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    WorkerCallObject *self_call = PyObject_New(WorkerCallObject, &oi_py_worker_call_type);
    call_t *c = self_call != NULL ? calloc(1, sizeof(*c)) : NULL;
    if (c == NULL) {
        Py_XDECREF(self_call);
        return PyErr_NoMemory();
    }
    c->tail = &c->head;
    c->efd = -1;
    self_call->c = c;
    int stale = 0, rc = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&mux.mu);
    /* Sent under the lock: a request naming the job's inputs goes before the job's end does. */
    stale = job != Py_None && (mux.job_req == NULL || mux.job_no != job_no);
    if (!stale) {
        c->id = mux.next_id++;
        c->next = mux.calls;
        mux.calls = c;
        if (mux.gone || (rc = send_to_server(OI_PW_BLS, c->id, fd)) != 0) {
            static const char why[] = "the server closed the worker's connection during a BLS request";
            end_call(c, OI_UNAVAILABLE, why, sizeof(why) - 1);
        }
    }
    pthread_mutex_unlock(&mux.mu);
    Py_END_ALLOW_THREADS
    if (stale) {
        c->ended = 1; /* never listed nor sent: freed alone */
        Py_DECREF(self_call);
        Py_RETURN_NONE;
    }
    return (PyObject *)self_call;
}

static void WorkerCall_dealloc(WorkerCallObject *self)
{
    call_t *c = self->c;
    pthread_mutex_lock(&mux.mu);
    for (call_t **at = &mux.calls; *at != NULL; at = &(*at)->next)
        if (*at == c) {
            *at = c->next;
            break;
        }
    int waited = !c->ended && !mux.gone;
    pthread_mutex_unlock(&mux.mu);
    if (waited)
        send_to_server(OI_PW_BLS_CANCEL, c->id, -1); /* nobody waits for it any more */
    for (part_t *p = c->head, *n; p != NULL; p = n) {
        n = p->next;
        close(p->fd);
        free(p);
    }
    if (c->efd >= 0)
        close(c->efd);
    free(c->text);
    free(c);
    PyObject_Free(self);
}

/* next(timeout=-1): the memfd of the next response (the caller's to close: triton_wire reads
 * it), None once the call has ended well, (status, message) when it ended with an error, False
 * when `timeout` seconds passed first (< 0: wait as long as it takes). */
static PyObject *WorkerCall_next(WorkerCallObject *self, PyObject *args)
{
    double timeout = -1;
    if (!PyArg_ParseTuple(args, "|d", &timeout))
        return NULL;
    call_t *c = self->c;
    part_t *p = NULL;
    int ended = 0;
    Py_BEGIN_ALLOW_THREADS
    struct timespec until = oi_deadline_in(timeout > 0 ? timeout : 0);
    pthread_mutex_lock(&mux.mu);
    while (c->head == NULL && !c->ended && timeout != 0)
        if (timeout < 0)
            pthread_cond_wait(&mux.cv, &mux.mu);
        else if (pthread_cond_timedwait(&mux.cv, &mux.mu, &until) != 0)
            break;
    if ((p = c->head) != NULL && (c->head = p->next) == NULL)
        c->tail = &c->head;
    ended = c->ended;
    pthread_mutex_unlock(&mux.mu);
    Py_END_ALLOW_THREADS
    if (p != NULL) {
        int fd = p->fd;
        free(p);
        return PyLong_FromLong(fd);
    }
    if (!ended)
        Py_RETURN_FALSE;
    if (c->code == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(is)", c->code, c->text != NULL ? c->text : "out of memory");
}

/* fileno(): an eventfd readable at each response and at the end (for an asyncio loop's
 * add_reader); the caller reads it before it calls next(0). */
static PyObject *WorkerCall_fileno(WorkerCallObject *self, PyObject *Py_UNUSED(ignored))
{
    call_t *c = self->c;
    pthread_mutex_lock(&mux.mu);
    if (c->efd < 0 && (c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) >= 0 && (c->head != NULL || c->ended))
        wake_call(c);
    int fd = c->efd;
    pthread_mutex_unlock(&mux.mu);
    if (fd < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(fd);
}

/* cancel(): the caller no longer wants the answer; the server cancels the request, whose end
 * still comes. */
static PyObject *WorkerCall_cancel(WorkerCallObject *self, PyObject *Py_UNUSED(ignored))
{
    int ended;
    pthread_mutex_lock(&mux.mu);
    ended = self->c->ended || mux.gone;
    pthread_mutex_unlock(&mux.mu);
    if (!ended)
        send_to_server(OI_PW_BLS_CANCEL, self->c->id, -1);
    Py_RETURN_NONE;
}

static PyMethodDef WorkerCall_methods[] = {
    {"next", (PyCFunction)WorkerCall_next, METH_VARARGS,
     "next(timeout=-1) -> memfd of a response | None (ended) | (status, message) | False (timed out)"},
    {"fileno", (PyCFunction)WorkerCall_fileno, METH_NOARGS, "An eventfd readable at each response and at the end."},
    {"cancel", (PyCFunction)WorkerCall_cancel, METH_NOARGS, "Cancels the call (its caller no longer waits)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject oi_py_worker_call_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "openinfer._core.WorkerBlsCall",
    .tp_basicsize = sizeof(WorkerCallObject),
    .tp_dealloc = (destructor)WorkerCall_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A BLS call a model in a worker process made over the process wire: _core.worker_bls makes one.",
    .tp_methods = WorkerCall_methods,
};
