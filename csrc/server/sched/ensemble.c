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

struct oi_ensemble_s {
    oi_registry_t *reg;         /* borrowed */
    const oi_model_t *self;     /* borrowed: the ensemble's own model, which owns this state */
    char *name;
    int count_stats;
    char **tensors; /* every ensemble tensor's name, once */
    uint32_t n_tensors;
    step_t *steps;
    uint32_t n_steps;
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

oi_ensemble_t *oi_ensemble_new(oi_registry_t *reg, const oi_model_t *self, int count_stats,
                               const oi_ensemble_step_spec_t *steps, uint32_t n_steps)
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
    return e;
}

/* ---- one request ---------------------------------------------------------------------- */

typedef struct run_s run_t;

/* run_t.have of an optional ensemble input the request left out: the steps that read it are
 * sent without it, as Triton's ensemble scheduler sends them. */
#define ABSENT 2

/* A step of one request. Its job goes to the step model's scheduler; the run owns it. */
typedef struct {
    oi_job_t job; /* first: the scheduler hands back &job */
    run_t *run;
    uint32_t idx;
    int state;            /* under run->mu: 0 waiting for inputs, 1 sent (or being sent), 2 done */
    uint32_t launch_next; /* the next step to send in a list built under run->mu (UINT32_MAX: end) */
    oi_model_t *model;    /* one reference once looked up */
    oi_request_t req;     /* inputs reference the ensemble tensors' buffers */
    const char **names;   /* the outputs asked of the model (validated) */
} step_run_t;

/* Lives on the stack of the ensemble's executor, which returns only once `inflight` is 0: no
 * step callback touches it after that. */
struct run_s {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const oi_ensemble_t *e;
    const oi_request_t *req; /* the ensemble's request, which outlives the run */
    oi_tensor_t *vals; /* per ensemble tensor, once produced: a reference to its bytes */
    int64_t *batch;    /* per ensemble tensor: the batch size of the request that made it, 0
                        * when that model (or the ensemble) does not batch */
    uint8_t *have;     /* per ensemble tensor: 1 made, ABSENT an optional input not sent */
    step_run_t *steps;
    int inflight;     /* steps sent and not done, plus callers still sending */
    oi_status_t *err; /* the first failure; no step is sent after it */
};

static void launch(run_t *run, uint32_t first);

/* Under run->mu: notes the first failure, naming the step as Triton prefixes an ensemble's
 * errors ("in ensemble 'E', ..."). Takes `st`. */
static void fail(run_t *run, const step_run_t *s, oi_status_t *st)
{
    if (run->err != NULL) {
        oi_status_free(st);
        return;
    }
    const step_t *def = &run->e->steps[s->idx];
    run->err = oi_status_new(st->code, "in ensemble '%s', step %u (model '%s'): %s", run->e->name, s->idx,
                             def->model_name, st->message);
    oi_status_free(st);
}

/* Under run->mu: marks the steps whose inputs all exist as sent and links them into a list
 * for `launch`; counts them in inflight. Returns the first, or UINT32_MAX. */
static uint32_t pick_ready(run_t *run)
{
    uint32_t first = UINT32_MAX, *tail = &first;
    if (run->err != NULL)
        return first;
    for (uint32_t i = 0; i < run->e->n_steps; i++) {
        step_run_t *s = &run->steps[i];
        if (s->state != 0)
            continue;
        const step_t *def = &run->e->steps[i];
        int ready = 1;
        for (uint32_t j = 0; j < def->n_inputs && ready; j++)
            ready = run->have[def->inputs[j].tensor];
        if (!ready)
            continue;
        s->state = 1;
        s->launch_next = UINT32_MAX;
        *tail = i;
        tail = &s->launch_next;
        run->inflight++;
    }
    return first;
}

/* A step that ended (done or never sent): one less in flight. The run may be gone after. */
static void step_end(run_t *run, step_run_t *s, oi_status_t *st)
{
    pthread_mutex_lock(&run->mu);
    if (st != NULL)
        fail(run, s, st);
    s->state = 2;
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

/* On a step model's executor, once it ran: checks the outputs, counts the request in the
 * model's statistics, publishes the outputs as ensemble tensors and sends the steps they make
 * ready. */
static void step_done(oi_job_t *j)
{
    step_run_t *s = (step_run_t *)j;
    run_t *run = s->run;
    const step_t *def = &run->e->steps[s->idx];
    if (j->status == NULL)
        j->status = oi_validate_response(s->model, j->output_names, j->n_outputs, &j->resp);
    if (j->counted && j->slot != NULL)
        oi_stats_request(j->slot, &j->times, oi_now_ns(), j->status == NULL,
                         j->times.compute_start       ? OI_FAIL_BACKEND
                         : atomic_load(&j->cancelled) ? OI_FAIL_CANCELED
                                                      : OI_FAIL_REJECTED,
                         j->rows);
    pthread_mutex_lock(&run->mu);
    uint32_t next = UINT32_MAX;
    if (j->status != NULL) {
        fail(run, s, j->status);
        j->status = NULL;
    } else {
        /* The outputs come in the order they were asked, which is the output map's. */
        int64_t batch = batch_of(s->model, &s->req);
        for (uint32_t i = 0; i < def->n_outputs && i < j->resp.n_outputs; i++) {
            uint32_t t = def->outputs[i].tensor;
            run->vals[t] = j->resp.outputs[i]; /* takes its owner reference */
            run->batch[t] = batch;
            run->vals[t].name = run->e->tensors[t];
            run->vals[t].parameters = (oi_slice_t){0};
            run->have[t] = 1;
            j->resp.outputs[i].owner = NULL;
        }
        next = pick_ready(run);
    }
    pthread_mutex_unlock(&run->mu); /* this step still counts in inflight while it sends */
    launch(run, next);
    step_end(run, s, NULL);
}

/* Looks up the step's model, builds its request over the ensemble tensors and queues it. */
static oi_status_t *send_step(run_t *run, step_run_t *s)
{
    const step_t *def = &run->e->steps[s->idx];
    oi_status_t *st = NULL;
    s->model = oi_registry_find(run->e->reg, def->model_name, def->version, &st);
    if (s->model == NULL)
        return st;
    if ((st = oi_model_check_ready(s->model)) != NULL)
        return st;
    if (s->model->decoupled || s->model->seq != NULL)
        return oi_status_new(OI_UNIMPLEMENTED, "model '%s' is %s: openinfer does not run it as an ensemble step",
                             def->model_name, s->model->decoupled ? "decoupled" : "a sequence model");
    oi_request_t *r = &s->req;
    r->inputs = calloc(def->n_inputs ? def->n_inputs : 1, sizeof(*r->inputs));
    r->outputs = calloc(def->n_outputs ? def->n_outputs : 1, sizeof(*r->outputs));
    if (r->inputs == NULL || r->outputs == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    /* No lock: a tensor once produced is not written again until the run ends. */
    for (uint32_t i = 0; i < def->n_inputs; i++) {
        if (run->have[def->inputs[i].tensor] == ABSENT)
            continue;
        oi_tensor_t *t = &r->inputs[r->n_inputs++];
        *t = run->vals[def->inputs[i].tensor];
        t->name = def->inputs[i].model_tensor;
        t->owner = oi_buf_ref(t->owner);
        reshape(spec_named(s->model->inputs, s->model->n_inputs, t->name), s->model->max_batch_size > 0,
                run->batch[def->inputs[i].tensor], t);
    }
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
    if (oi_scheduler_submit(s->model->sched, &s->job) != 0)
        return oi_status_new(OI_UNAVAILABLE, "the server is shutting down");
    return NULL;
}

/* Sends the listed steps (outside run->mu: a refused submit calls `done` at once). */
static void launch(run_t *run, uint32_t first)
{
    for (uint32_t i = first; i != UINT32_MAX;) {
        step_run_t *s = &run->steps[i];
        i = s->launch_next; /* read before sending: once sent, the step may be done */
        oi_status_t *st = send_step(run, s);
        if (st != NULL)
            step_end(run, s, st);
    }
}

static void deadline_after(struct timespec *ts, long long ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_nsec += ns;
    ts->tv_sec += ts->tv_nsec / 1000000000LL;
    ts->tv_nsec %= 1000000000LL;
}

/* Waits until no step is in flight; when the request's client goes, cancels the steps sent. */
static void wait_steps(run_t *run, const oi_request_t *req)
{
    int cancelled = 0;
    pthread_mutex_lock(&run->mu);
    while (run->inflight > 0) {
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
            for (uint32_t i = 0; i < run->e->n_steps; i++)
                if (run->steps[i].state == 1)
                    oi_job_cancel(&run->steps[i].job);
        }
    }
    pthread_mutex_unlock(&run->mu);
}

/* The ensemble's answer: the asked outputs as references to the tensors the steps made. */
static oi_status_t *assemble(run_t *run, const char *const *names, uint32_t n, oi_response_t *resp)
{
    resp->outputs = calloc(n ? n : 1, sizeof(*resp->outputs));
    if (resp->outputs == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        int t = tensor_index(run->e, names[i]);
        if (t < 0 || !run->have[t])
            return oi_status_new(OI_INTERNAL,
                                 "in ensemble '%s', unexpected deadlock, at least one output is not set while no "
                                 "more ensemble steps can be made",
                                 run->e->name);
        oi_tensor_t *o = &resp->outputs[resp->n_outputs++];
        *o = run->vals[t];
        o->name = names[i];
        o->owner = oi_buf_ref(o->owner);
        const oi_model_t *self = run->e->self;
        reshape(spec_named(self->outputs, self->n_outputs, names[i]), self->max_batch_size > 0, run->batch[t], o);
    }
    return NULL;
}

static void run_clear(run_t *run)
{
    for (uint32_t i = 0; run->steps != NULL && i < run->e->n_steps; i++) {
        step_run_t *s = &run->steps[i];
        oi_request_clear(&s->req);
        oi_response_clear(&s->job.resp);
        oi_status_free(s->job.status);
        free(s->names);
        if (s->model != NULL)
            oi_model_unref(s->model);
    }
    for (uint32_t i = 0; run->vals != NULL && i < run->e->n_tensors; i++)
        if (run->have[i] == 1)
            oi_tensor_clear(&run->vals[i]);
    free(run->steps);
    free(run->vals);
    free(run->batch);
    free(run->have);
    oi_status_free(run->err);
    pthread_cond_destroy(&run->cv);
    pthread_mutex_destroy(&run->mu);
}

static oi_status_t *ensemble_execute(void *state, const oi_request_t *req, const char *const *output_names,
                                     uint32_t n_outputs, oi_response_t *resp)
{
    const oi_ensemble_t *e = state;
    run_t run = {.e = e, .req = req};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&run.cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&run.mu, NULL);
    run.vals = calloc(e->n_tensors ? e->n_tensors : 1, sizeof(*run.vals));
    run.batch = calloc(e->n_tensors ? e->n_tensors : 1, sizeof(*run.batch));
    run.have = calloc(e->n_tensors ? e->n_tensors : 1, 1);
    run.steps = calloc(e->n_steps ? e->n_steps : 1, sizeof(*run.steps));
    oi_status_t *st = NULL;
    if (run.vals == NULL || run.batch == NULL || run.have == NULL || run.steps == NULL) {
        st = oi_status_new(OI_INTERNAL, "out of memory");
        goto out;
    }
    for (uint32_t i = 0; i < e->n_steps; i++) {
        run.steps[i].run = &run;
        run.steps[i].idx = i;
        run.steps[i].req.binary_data_output = -1;
    }
    /* The request's inputs are the first ensemble tensors (validated against the ensemble's
     * declared inputs; each one is read by some step, as the load checked). */
    for (uint32_t i = 0; i < req->n_inputs; i++) {
        int t = tensor_index(e, req->inputs[i].name);
        if (t < 0 || run.have[t])
            continue;
        run.vals[t] = req->inputs[i];
        run.vals[t].name = e->tensors[t];
        run.vals[t].parameters = (oi_slice_t){0};
        run.vals[t].owner = oi_buf_ref(run.vals[t].owner);
        run.batch[t] = batch_of(e->self, req);
        run.have[t] = 1;
    }
    for (uint32_t i = 0; i < e->self->n_inputs; i++) {
        int t = tensor_index(e, e->self->inputs[i].name);
        if (t >= 0 && !run.have[t] && e->self->inputs[i].optional)
            run.have[t] = ABSENT;
    }
    pthread_mutex_lock(&run.mu);
    uint32_t first = pick_ready(&run);
    run.inflight++; /* this thread, while it sends */
    pthread_mutex_unlock(&run.mu);
    launch(&run, first);
    pthread_mutex_lock(&run.mu);
    run.inflight--;
    pthread_mutex_unlock(&run.mu);
    wait_steps(&run, req);
    if (run.err != NULL) {
        st = run.err;
        run.err = NULL;
    } else {
        st = assemble(&run, output_names, n_outputs, resp);
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
