#include "server/sched/ensemble.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/infer.h"
#include "server/validate.h"

/* How often a waiting ensemble request looks whether its client has gone (to cancel the steps
 * still queued or running). */
#define CANCEL_POLL_NS 20000000LL

typedef struct {
    char *model_tensor;
    uint32_t tensor; /* index into oi_ensemble_t.tensors */
} step_map_t;

typedef struct {
    char *model_name;
    char version[24]; /* "" for the default version */
    step_map_t *inputs;
    uint32_t n_inputs;
    step_map_t *outputs;
    uint32_t n_outputs;
} step_t;

/* The runs of one step in flight, over every request of the ensemble (max_inflight_requests). */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t inflight;
} limiter_t;

struct oi_ensemble_s {
    oi_registry_t *reg;         /* borrowed */
    const oi_model_t *self;     /* borrowed: the ensemble's own model, which owns this state */
    char *name;
    int count_stats;
    char **tensors; /* every ensemble tensor's name, once */
    uint32_t n_tensors;
    step_t *steps;
    uint32_t n_steps;
    uint32_t max_inflight; /* Triton's max_inflight_requests per step; 0: no limit */
    limiter_t *limiters;   /* per step */
};

static void ensemble_free(oi_ensemble_t *e)
{
    if (e == NULL)
        return;
    for (uint32_t i = 0; i < e->n_steps; i++) {
        step_t *s = &e->steps[i];
        free(s->model_name);
        for (uint32_t j = 0; j < s->n_inputs; j++)
            free(s->inputs[j].model_tensor);
        for (uint32_t j = 0; j < s->n_outputs; j++)
            free(s->outputs[j].model_tensor);
        free(s->inputs);
        free(s->outputs);
    }
    for (uint32_t i = 0; e->limiters != NULL && i < e->n_steps; i++) {
        pthread_cond_destroy(&e->limiters[i].cv);
        pthread_mutex_destroy(&e->limiters[i].mu);
    }
    free(e->limiters);
    for (uint32_t i = 0; i < e->n_tensors; i++)
        free(e->tensors[i]);
    free(e->tensors);
    free(e->steps);
    free(e->name);
    free(e);
}

static int tensor_index(const oi_ensemble_t *e, const char *name)
{
    for (uint32_t i = 0; i < e->n_tensors; i++)
        if (strcmp(e->tensors[i], name) == 0)
            return (int)i;
    return -1;
}

/* The index of ensemble tensor `name`, added when new; -1 when out of memory. */
static int intern_tensor(oi_ensemble_t *e, const char *name, uint32_t cap)
{
    int i = tensor_index(e, name);
    if (i >= 0)
        return i;
    if (e->n_tensors == cap || (e->tensors[e->n_tensors] = strdup(name)) == NULL)
        return -1;
    return (int)e->n_tensors++;
}

static int copy_maps(oi_ensemble_t *e, uint32_t cap, const oi_ensemble_map_t *in, uint32_t n, step_map_t **out)
{
    *out = calloc(n ? n : 1, sizeof(**out));
    if (*out == NULL)
        return -1;
    for (uint32_t i = 0; i < n; i++) {
        int t = intern_tensor(e, in[i].ensemble_tensor, cap);
        if (t < 0 || ((*out)[i].model_tensor = strdup(in[i].model_tensor)) == NULL)
            return -1;
        (*out)[i].tensor = (uint32_t)t;
    }
    return 0;
}

/* Its timed waits count on the monotonic clock (deadline_after). */
static void cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
}

oi_ensemble_t *oi_ensemble_new(oi_registry_t *reg, const oi_model_t *self, int count_stats,
                               const oi_ensemble_step_spec_t *steps, uint32_t n_steps, uint32_t max_inflight)
{
    uint32_t cap = 0;
    for (uint32_t i = 0; i < n_steps; i++)
        cap += steps[i].n_inputs + steps[i].n_outputs;
    oi_ensemble_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    e->reg = reg;
    e->self = self;
    e->count_stats = count_stats;
    e->max_inflight = max_inflight;
    e->name = strdup(self->name);
    e->tensors = calloc(cap ? cap : 1, sizeof(*e->tensors));
    e->steps = calloc(n_steps ? n_steps : 1, sizeof(*e->steps));
    if (e->name == NULL || e->tensors == NULL || e->steps == NULL) {
        ensemble_free(e);
        return NULL;
    }
    for (uint32_t i = 0; i < n_steps; i++) {
        step_t *s = &e->steps[e->n_steps++];
        if ((s->model_name = strdup(steps[i].model_name)) == NULL ||
            copy_maps(e, cap, steps[i].inputs, steps[i].n_inputs, &s->inputs) != 0 ||
            (s->n_inputs = steps[i].n_inputs,
             copy_maps(e, cap, steps[i].outputs, steps[i].n_outputs, &s->outputs) != 0)) {
            ensemble_free(e);
            return NULL;
        }
        s->n_outputs = steps[i].n_outputs;
        if (steps[i].model_version >= 0)
            snprintf(s->version, sizeof(s->version), "%lld", (long long)steps[i].model_version);
    }
    /* Last: ensemble_free destroys the limiters of the n_steps steps once they exist. */
    if ((e->limiters = calloc(n_steps ? n_steps : 1, sizeof(*e->limiters))) == NULL) {
        ensemble_free(e);
        return NULL;
    }
    for (uint32_t i = 0; i < n_steps; i++) {
        pthread_mutex_init(&e->limiters[i].mu, NULL);
        cond_init_monotonic(&e->limiters[i].cv);
    }
    return e;
}

/* ---- one request ---------------------------------------------------------------------- */

typedef struct run_s run_t;

/* value_t.have of a tensor left unset (an optional ensemble input the request left out, an
 * output a step did not produce): the steps that read it are sent without it, as Triton's
 * ensemble scheduler sends them. */
#define ABSENT 2

/* One value of an ensemble tensor. A decoupled step makes one per response: the n-th value of
 * each tensor is its n-th "iteration", and a step runs once per iteration of its inputs. */
typedef struct {
    oi_tensor_t val; /* a reference to its bytes when have is 1 */
    int64_t batch;   /* the batch size of the request that made it, 0 when that model (or the
                      * ensemble) does not batch */
    uint8_t have;    /* 1 made, ABSENT left unset */
} value_t;

typedef struct {
    value_t *v; /* by iteration */
    uint32_t n, cap;
    uint32_t kept; /* the values before it are dropped: every reader has its reference */
} values_t;

/* One run of a step (one iteration of its inputs). Its job goes to the step model's
 * scheduler; the run owns it. */
typedef struct step_run_s {
    oi_job_t job; /* first: the scheduler hands back &job */
    run_t *run;
    uint32_t idx;
    struct step_run_s *launch_next; /* the next step to send in a list built under run->mu */
    struct step_run_s *all_next;    /* every step run of the request, for run_clear */
    int limited;                    /* holds a slot of the step's max_inflight_requests */
    oi_model_t *model;              /* one reference once looked up */
    oi_request_t req;               /* inputs reference the ensemble tensors' buffers */
    int64_t *in_batch;              /* per input of req: its value's batch */
    const char **names;             /* the outputs asked of the model (validated) */
} step_run_t;

/* Lives on the stack of the ensemble's executor, which returns only once `inflight` is 0: no
 * step callback touches it after that. */
struct run_s {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const oi_ensemble_t *e;
    const oi_request_t *req; /* the ensemble's request, which outlives the run */
    const char *const *names; /* the outputs asked of the ensemble */
    uint32_t n_names;
    uint32_t answered;       /* a decoupled ensemble's answers sent (their iterations) */
    uint32_t answerable;     /* once a step failed: the answers complete before, still sent */
    values_t *vals;          /* per ensemble tensor */
    uint32_t *fired;         /* per step: the iterations sent */
    step_run_t *all;
    int inflight;     /* step runs sent and not done, plus callers still sending */
    oi_status_t *err; /* the first failure; no step is sent after it */
};

static void launch(run_t *run, step_run_t *first);
static uint32_t answers_ready(const run_t *run);

/* Under run->mu: notes the first failure, naming the step as Triton prefixes an ensemble's
 * errors ("in ensemble 'E', ..."). Takes `st`. */
static void fail(run_t *run, uint32_t idx, oi_status_t *st)
{
    if (run->err != NULL) {
        oi_status_free(st);
        return;
    }
    const step_t *def = &run->e->steps[idx];
    run->answerable = answers_ready(run); /* they go before the error, as in Triton's stream */
    run->err = oi_status_new(st->code, "in ensemble '%s', step %u (model '%s'): %s", run->e->name, idx,
                             def->model_name, st->message);
    oi_status_free(st);
}

/* Under run->mu: appends a value to ensemble tensor `t`, taking `val`'s owner reference when
 * `have` is 1. Returns -1 when out of memory (the reference is dropped). */
static int add_value(run_t *run, uint32_t t, const oi_tensor_t *val, int64_t batch, uint8_t have)
{
    values_t *vs = &run->vals[t];
    if (vs->n == vs->cap) {
        uint32_t cap = vs->cap ? vs->cap * 2 : 1;
        value_t *v = realloc(vs->v, cap * sizeof(*v));
        if (v == NULL) {
            if (have == 1)
                oi_buf_unref(val->owner);
            return -1;
        }
        vs->v = v;
        vs->cap = cap;
    }
    value_t *v = &vs->v[vs->n++];
    *v = (value_t){.batch = batch, .have = have};
    if (have == 1) {
        v->val = *val;
        v->val.name = run->e->tensors[t];
        v->val.parameters = (oi_slice_t){0};
    }
    return 0;
}

/* Under run->mu: a run of step `idx` for `iter`, its inputs references to that iteration's
 * values (copied here: the value arrays may grow once the lock is gone). */
static step_run_t *new_step_run(run_t *run, uint32_t idx, uint32_t iter)
{
    const step_t *def = &run->e->steps[idx];
    step_run_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->all_next = run->all;
    run->all = s;
    s->run = run;
    s->idx = idx;
    s->req.binary_data_output = -1;
    oi_request_t *r = &s->req;
    r->inputs = calloc(def->n_inputs ? def->n_inputs : 1, sizeof(*r->inputs));
    s->in_batch = calloc(def->n_inputs ? def->n_inputs : 1, sizeof(*s->in_batch));
    if (r->inputs == NULL || s->in_batch == NULL)
        return NULL;
    for (uint32_t i = 0; i < def->n_inputs; i++) {
        const value_t *v = &run->vals[def->inputs[i].tensor].v[iter];
        if (v->have == ABSENT)
            continue;
        s->in_batch[r->n_inputs] = v->batch;
        oi_tensor_t *t = &r->inputs[r->n_inputs++];
        *t = v->val;
        t->name = def->inputs[i].model_tensor;
        t->owner = oi_buf_ref(t->owner);
    }
    return s;
}

static int asked(const run_t *run, uint32_t t)
{
    for (uint32_t i = 0; i < run->n_names; i++)
        if (strcmp(run->names[i], run->e->tensors[t]) == 0)
            return 1;
    return 0;
}

/* Under run->mu: the iterations of tensor `t` that every reader has (the steps that read it
 * were sent with them; a decoupled ensemble answered them), so that a long stream of a
 * decoupled step holds only the values still to be read. */
static uint32_t read_by_all(const run_t *run, uint32_t t)
{
    uint32_t done = run->vals[t].n;
    for (uint32_t i = 0; i < run->e->n_steps; i++)
        for (uint32_t j = 0; j < run->e->steps[i].n_inputs; j++)
            if (run->e->steps[i].inputs[j].tensor == t && run->fired[i] < done)
                done = run->fired[i];
    if (asked(run, t)) {
        uint32_t answered = run->req->send != NULL ? run->answered : 0; /* a unary one answers at the end */
        done = answered < done ? answered : done;
    }
    return done;
}

static void drop_read_values(run_t *run)
{
    for (uint32_t t = 0; t < run->e->n_tensors; t++) {
        values_t *vs = &run->vals[t];
        for (uint32_t end = read_by_all(run, t); vs->kept < end; vs->kept++)
            if (vs->v[vs->kept].have == 1)
                oi_tensor_clear(&vs->v[vs->kept].val);
    }
}

/* Under run->mu: the step runs whose inputs all have a value of an iteration not sent yet,
 * linked into a list for `launch` and counted in inflight. Returns the first, or NULL. */
static step_run_t *pick_ready(run_t *run)
{
    step_run_t *first = NULL, **tail = &first;
    for (uint32_t i = 0; i < run->e->n_steps && run->err == NULL; i++) {
        const step_t *def = &run->e->steps[i];
        uint32_t ready = UINT32_MAX;
        for (uint32_t j = 0; j < def->n_inputs; j++)
            if (run->vals[def->inputs[j].tensor].n < ready)
                ready = run->vals[def->inputs[j].tensor].n;
        for (; run->fired[i] < ready && run->err == NULL; run->fired[i]++) {
            step_run_t *s = new_step_run(run, i, run->fired[i]);
            if (s == NULL) {
                fail(run, i, oi_status_new(OI_INTERNAL, "out of memory"));
                break;
            }
            *tail = s;
            tail = &s->launch_next;
            run->inflight++;
        }
    }
    drop_read_values(run);
    return first;
}

/* Triton's StepInflightRequestLimiter: with max_inflight_requests, a step is sent only while
 * fewer than that many of its runs (over every request of the ensemble) are in flight, so a
 * decoupled step that answers faster than the next step runs is held in its send. It gives
 * up waiting when the request is cancelled, and after Triton's 300 s (then it sends anyway:
 * a stuck limit must not hang the request). */
#define LIMIT_WAIT_NS (300LL * 1000000000LL)

static void deadline_after(struct timespec *ts, long long ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_nsec += ns;
    ts->tv_sec += ts->tv_nsec / 1000000000LL;
    ts->tv_nsec %= 1000000000LL;
}

/* Whether the ensemble's client has gone, seen at once (the executor's poll notes it in
 * run->err only up to CANCEL_POLL_NS later). */
static int run_cancelled(const run_t *run)
{
    const oi_request_t *req = run->req;
    return req->cancelled != NULL && req->cancelled(req->cancelled_arg);
}

/* Returns 0 once a slot is held (or the wait gave up after LIMIT_WAIT_NS), -1 when the request
 * was cancelled while it waited: then nothing is sent. */
static int limit_acquire(run_t *run, step_run_t *s)
{
    limiter_t *l = &run->e->limiters[s->idx];
    if (run->e->max_inflight == 0)
        return 0;
    long long waited = 0;
    pthread_mutex_lock(&l->mu);
    while (l->inflight >= run->e->max_inflight && waited < LIMIT_WAIT_NS) {
        if (run_cancelled(run)) {
            pthread_mutex_unlock(&l->mu);
            return -1;
        }
        struct timespec ts;
        deadline_after(&ts, CANCEL_POLL_NS);
        pthread_cond_timedwait(&l->cv, &l->mu, &ts);
        waited += CANCEL_POLL_NS;
    }
    l->inflight++;
    pthread_mutex_unlock(&l->mu);
    s->limited = 1;
    return 0;
}

static void limit_release(const run_t *run, step_run_t *s)
{
    if (!s->limited)
        return;
    limiter_t *l = &run->e->limiters[s->idx];
    pthread_mutex_lock(&l->mu);
    l->inflight--;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    s->limited = 0;
}

/* A step run that ended (done or never sent): one less in flight. The run may be gone after. */
static void step_end(run_t *run, step_run_t *s, oi_status_t *st)
{
    limit_release(run, s);
    pthread_mutex_lock(&run->mu);
    if (st != NULL)
        fail(run, s->idx, st);
    if (--run->inflight == 0)
        pthread_cond_signal(&run->cv);
    pthread_mutex_unlock(&run->mu);
}

/* The batch size of a request to `m`, as Triton's ensemble records it with each tensor: the
 * first dimension when the model batches, else 0. */
static int64_t batch_of(const oi_model_t *m, const oi_request_t *req)
{
    if (m->max_batch_size <= 0 || req->n_inputs == 0 || req->inputs[0].ndim < 1)
        return 0;
    return req->inputs[0].shape[0];
}

static uint64_t request_rows(const oi_model_t *m, const oi_request_t *req)
{
    int64_t b = batch_of(m, req);
    return b < 1 ? 1 : (uint64_t)b;
}

/* Triton's ReshapeTensorDims (ensemble_scheduler.cc): a tensor passing between a model that
 * batches and one that does not. `spec` is the receiving model's declaration (the batch
 * dimension first when `batching`), `batch` the tensor's batch size (0: made unbatched). A
 * tensor made unbatched whose shape is the declared one goes to a batching model as a batch
 * of one; otherwise it goes as it is, its first dimension the batch. A batch of one whose
 * shape is not the declared one goes to a model that does not batch without that dimension. */
static void reshape(const oi_io_spec_t *spec, int batching, int64_t batch, oi_tensor_t *t)
{
    if (spec == NULL || spec->ndim < 0 || batching == (batch != 0))
        return;
    int skip = batching ? 1 : 0, n = spec->ndim - skip;
    int same = n == t->ndim;
    for (int i = 0; same && i < n; i++)
        same = spec->dims[skip + i] == -1 || spec->dims[skip + i] == t->shape[i];
    if (batching && same && t->ndim < OI_MAX_DIMS) {
        memmove(t->shape + 1, t->shape, (size_t)t->ndim * sizeof(t->shape[0]));
        t->shape[0] = 1;
        t->ndim++;
    } else if (!batching && !same && batch == 1 && t->ndim > 0) {
        memmove(t->shape, t->shape + 1, (size_t)(t->ndim - 1) * sizeof(t->shape[0]));
        t->ndim--;
    }
}

static const oi_io_spec_t *spec_named(const oi_io_spec_t *specs, uint32_t n, const char *name)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(specs[i].name, name) == 0)
            return &specs[i];
    return NULL;
}

/* Publishes one response of step run `s` as the next iteration of its output tensors (an
 * output it left out as unset, as Triton's ConsumeResponse does), then sends the step runs it
 * made ready. Takes the outputs' references. */
static void publish(step_run_t *s, oi_response_t *resp)
{
    run_t *run = s->run;
    const step_t *def = &run->e->steps[s->idx];
    int64_t batch = batch_of(s->model, &s->req);
    pthread_mutex_lock(&run->mu);
    for (uint32_t i = 0; i < def->n_outputs; i++) {
        oi_tensor_t *made = NULL;
        for (uint32_t k = 0; k < resp->n_outputs && made == NULL; k++)
            if (strcmp(resp->outputs[k].name, def->outputs[i].model_tensor) == 0)
                made = &resp->outputs[k];
        if (add_value(run, def->outputs[i].tensor, made, batch, made != NULL ? 1 : ABSENT) != 0)
            fail(run, s->idx, oi_status_new(OI_INTERNAL, "out of memory"));
        if (made != NULL)
            made->owner = NULL;
    }
    step_run_t *next = pick_ready(run);
    if (run->req->send != NULL && answers_ready(run) > run->answered)
        pthread_cond_signal(&run->cv); /* the ensemble's own executor has an answer to send */
    pthread_mutex_unlock(&run->mu);
    oi_response_clear(resp);
    launch(run, next);
}

/* A decoupled step model's `send`, on its executor: each response is a new iteration. */
static oi_status_t *step_send(void *arg, oi_response_t *resp)
{
    step_run_t *s = arg;
    oi_status_t *st = oi_validate_response(s->model, s->names, s->job.n_outputs, resp);
    if (st == NULL) {
        pthread_mutex_lock(&s->run->mu);
        int failed = s->run->err != NULL;
        pthread_mutex_unlock(&s->run->mu);
        if (failed || run_cancelled(s->run)) /* the ensemble failed or its client went: stop the model */
            st = oi_status_new(OI_CLIENT_CLOSED, "the request was cancelled");
    }
    if (st != NULL) {
        oi_response_clear(resp);
        return st;
    }
    publish(s, resp);
    return NULL;
}

/* On a step model's executor, once it ran: counts the request in the model's statistics and,
 * unless the model is decoupled (its responses went through step_send), checks and publishes
 * its outputs. */
static void step_done(oi_job_t *j)
{
    step_run_t *s = (step_run_t *)j;
    run_t *run = s->run;
    if (j->status == NULL && !s->model->decoupled)
        j->status = oi_validate_response(s->model, j->output_names, j->n_outputs, &j->resp);
    if (j->counted && j->slot != NULL)
        oi_stats_request(j->slot, &j->times, oi_now_ns(), j->status == NULL,
                         j->times.compute_start       ? OI_FAIL_BACKEND
                         : atomic_load(&j->cancelled) ? OI_FAIL_CANCELED
                                                      : OI_FAIL_REJECTED,
                         j->rows);
    oi_status_t *st = j->status;
    j->status = NULL;
    if (st == NULL && !s->model->decoupled)
        publish(s, &j->resp); /* this step still counts in inflight while it sends */
    step_end(run, s, st);
}

/* Looks up the step's model, readies its request over the ensemble tensors and queues it. */
static oi_status_t *send_step(run_t *run, step_run_t *s)
{
    const step_t *def = &run->e->steps[s->idx];
    oi_status_t *st = NULL;
    /* The ensemble's own namespace's model of that name first, as Triton resolves a step. */
    s->model = oi_registry_find_in(run->e->reg, run->e->self->ns, def->model_name, def->version, &st);
    if (s->model == NULL)
        return st;
    if ((st = oi_model_check_ready(s->model)) != NULL)
        return st;
    if (s->model->seq != NULL)
        return oi_status_new(OI_UNIMPLEMENTED, "model '%s' is a sequence model: openinfer does not run it as an "
                             "ensemble step", def->model_name);
    oi_request_t *r = &s->req;
    for (uint32_t i = 0; i < r->n_inputs; i++)
        reshape(spec_named(s->model->inputs, s->model->n_inputs, r->inputs[i].name), s->model->max_batch_size > 0,
                s->in_batch[i], &r->inputs[i]);
    r->outputs = calloc(def->n_outputs ? def->n_outputs : 1, sizeof(*r->outputs));
    if (r->outputs == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < def->n_outputs; i++) {
        r->outputs[r->n_outputs].name = def->outputs[i].model_tensor;
        r->outputs[r->n_outputs++].binary_data = -1;
    }
    r->parameters = run->req->parameters; /* as Triton's ensemble scheduler passes them on */
    uint32_t *classes = NULL;
    st = oi_validate_request(s->model, r, &s->names, &s->job.n_outputs, &classes);
    free(classes); /* none asked */
    if (st != NULL)
        return st;
    s->job.req = r;
    s->job.output_names = s->names;
    s->job.done = step_done;
    s->job.counted = run->e->count_stats;
    s->job.rows = request_rows(s->model, r);
    r->cancelled = oi_job_cancelled;
    r->cancelled_arg = &s->job;
    if (s->model->decoupled) {
        r->send = step_send;
        r->send_arg = s;
    }
    if (limit_acquire(run, s) != 0)
        return oi_status_new(OI_CLIENT_CLOSED, "the request was cancelled");
    if (oi_scheduler_submit(s->model->sched, &s->job) != 0)
        return oi_status_new(OI_UNAVAILABLE, "the server is shutting down");
    return NULL;
}

/* Sends the listed step runs (outside run->mu: a refused submit calls `done` at once). */
static void launch(run_t *run, step_run_t *first)
{
    for (step_run_t *s = first; s != NULL;) {
        step_run_t *next = s->launch_next; /* read before sending: once sent, the step may be done */
        oi_status_t *st = send_step(run, s);
        if (st != NULL)
            step_end(run, s, st);
        s = next;
    }
}

/* Under run->mu: how many iterations every asked output has a value of (Triton answers an
 * iteration once all the asked outputs have it). */
static uint32_t answers_ready(const run_t *run)
{
    uint32_t ready = UINT32_MAX;
    for (uint32_t i = 0; i < run->n_names; i++) {
        int t = tensor_index(run->e, run->names[i]);
        uint32_t got = t < 0 ? 0 : run->vals[t].n;
        ready = got < ready ? got : ready;
    }
    return run->n_names == 0 ? 0 : ready;
}

/* Under run->mu: the answer of iteration `iter`: the asked outputs as references to the
 * tensors the steps made (an output left unset is left out, as Triton leaves it: `absent`,
 * which the response check drops). */
static oi_status_t *assemble(run_t *run, uint32_t iter, oi_response_t *resp)
{
    const char *const *names = run->names;
    uint32_t n = run->n_names;
    resp->outputs = calloc(n ? n : 1, sizeof(*resp->outputs));
    if (resp->outputs == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        const value_t *v = &run->vals[tensor_index(run->e, names[i])].v[iter];
        oi_tensor_t *o = &resp->outputs[resp->n_outputs++];
        if (v->have != 1) {
            *o = (oi_tensor_t){.name = names[i], .absent = 1};
            continue;
        }
        *o = v->val;
        o->name = names[i];
        o->owner = oi_buf_ref(o->owner);
        const oi_model_t *self = run->e->self;
        reshape(spec_named(self->outputs, self->n_outputs, names[i]), self->max_batch_size > 0, v->batch, o);
    }
    return NULL;
}

/* Under run->mu, for a decoupled ensemble: sends the answers ready, in order (unlocking
 * while each goes: the client's back-pressure may hold it). */
static void send_answers(run_t *run)
{
    const oi_request_t *req = run->req;
    while (run->answered < (run->err == NULL ? answers_ready(run) : run->answerable)) {
        oi_response_t one = {0};
        oi_status_t *st = assemble(run, run->answered++, &one);
        pthread_mutex_unlock(&run->mu);
        if (st == NULL)
            st = req->send(req->send_arg, &one);
        oi_response_clear(&one);
        pthread_mutex_lock(&run->mu);
        if (st != NULL) { /* the client has gone (or out of memory): nothing more goes */
            run->answerable = 0;
            if (run->err == NULL)
                run->err = st;
            else
                oi_status_free(st);
        }
        drop_read_values(run);
    }
}

/* Waits until no step is in flight, sending a decoupled ensemble's answers as they become
 * ready; when the request's client goes, cancels the steps sent. */
static void wait_steps(run_t *run)
{
    const oi_request_t *req = run->req;
    int cancelled = 0;
    pthread_mutex_lock(&run->mu);
    for (;;) {
        if (req->send != NULL)
            send_answers(run);
        if (run->inflight == 0)
            break;
        if (req->cancelled == NULL || cancelled) {
            pthread_cond_wait(&run->cv, &run->mu);
            continue;
        }
        struct timespec ts;
        deadline_after(&ts, CANCEL_POLL_NS);
        pthread_cond_timedwait(&run->cv, &run->mu, &ts);
        if (run->inflight > 0 && req->cancelled(req->cancelled_arg)) {
            cancelled = 1;
            if (run->err == NULL)
                run->err = oi_status_new(OI_CLIENT_CLOSED, "in ensemble '%s', the request was cancelled", run->e->name);
            for (step_run_t *s = run->all; s != NULL; s = s->all_next)
                oi_job_cancel(&s->job);
        }
    }
    pthread_mutex_unlock(&run->mu);
}

static void run_clear(run_t *run)
{
    while (run->all != NULL) {
        step_run_t *s = run->all;
        run->all = s->all_next;
        oi_request_clear(&s->req);
        oi_response_clear(&s->job.resp);
        oi_status_free(s->job.status);
        free(s->names);
        free(s->in_batch);
        if (s->model != NULL)
            oi_model_unref(s->model);
        free(s);
    }
    for (uint32_t i = 0; run->vals != NULL && i < run->e->n_tensors; i++) {
        for (uint32_t k = run->vals[i].kept; k < run->vals[i].n; k++)
            if (run->vals[i].v[k].have == 1)
                oi_tensor_clear(&run->vals[i].v[k].val);
        free(run->vals[i].v);
    }
    free(run->vals);
    free(run->fired);
    oi_status_free(run->err);
    pthread_cond_destroy(&run->cv);
    pthread_mutex_destroy(&run->mu);
}

/* The request's inputs are the first values of the ensemble tensors (iteration 0; validated
 * against the ensemble's declared inputs, each read by some step as the load checked); an
 * optional input left out is unset. */
static int add_request_inputs(run_t *run, const oi_request_t *req)
{
    const oi_ensemble_t *e = run->e;
    for (uint32_t i = 0; i < e->self->n_inputs; i++) {
        int t = tensor_index(e, e->self->inputs[i].name);
        if (t < 0)
            continue;
        const oi_tensor_t *given = NULL;
        for (uint32_t k = 0; k < req->n_inputs && given == NULL; k++)
            if (strcmp(req->inputs[k].name, e->self->inputs[i].name) == 0)
                given = &req->inputs[k];
        if (given != NULL) {
            oi_tensor_t v = *given;
            v.owner = oi_buf_ref(v.owner);
            if (add_value(run, (uint32_t)t, &v, batch_of(e->self, req), 1) != 0)
                return -1;
        } else if (add_value(run, (uint32_t)t, NULL, 0, ABSENT) != 0) {
            return -1;
        }
    }
    return 0;
}

static oi_status_t *ensemble_execute(void *state, const oi_request_t *req, const char *const *output_names,
                                     uint32_t n_outputs, oi_response_t *resp)
{
    const oi_ensemble_t *e = state;
    run_t run = {.e = e, .req = req, .names = output_names, .n_names = n_outputs};
    cond_init_monotonic(&run.cv);
    pthread_mutex_init(&run.mu, NULL);
    run.vals = calloc(e->n_tensors ? e->n_tensors : 1, sizeof(*run.vals));
    run.fired = calloc(e->n_steps ? e->n_steps : 1, sizeof(*run.fired));
    oi_status_t *st = NULL;
    if (run.vals == NULL || run.fired == NULL || add_request_inputs(&run, req) != 0) {
        st = oi_status_new(OI_INTERNAL, "out of memory");
        goto out;
    }
    pthread_mutex_lock(&run.mu);
    step_run_t *first = pick_ready(&run);
    run.inflight++; /* this thread, while it sends */
    pthread_mutex_unlock(&run.mu);
    launch(&run, first);
    pthread_mutex_lock(&run.mu);
    run.inflight--;
    pthread_mutex_unlock(&run.mu);
    wait_steps(&run);
    if (run.err != NULL) {
        st = run.err;
        run.err = NULL;
    } else if (req->send == NULL && answers_ready(&run) == 0) {
        /* Only a decoupled ensemble may answer nothing (its stream just ends, as Triton's). */
        st = oi_status_new(OI_INTERNAL,
                           "in ensemble '%s', unexpected deadlock, at least one output is not set while no "
                           "more ensemble steps can be made",
                           e->name);
    } else if (req->send == NULL) {
        st = assemble(&run, 0, resp);
    }
out:
    run_clear(&run);
    return st;
}

static void ensemble_release(void *state)
{
    ensemble_free(state);
}

const oi_backend_t oi_ensemble_backend = {
    .name = "ensemble",
    .execute = ensemble_execute,
    .release = ensemble_release,
};
