#include "server/infer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "server/classify.h"
#include "server/sched/response_cache.h"
#include "server/validate.h"

oi_status_t *oi_infer_forward_headers(oi_request_t *req, const char *members, size_t n)
{
    if (n == 0)
        return NULL;
    oi_buf_t *b = oi_json_params_extend(req->parameters, members, n);
    if (b == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    oi_buf_unref(req->params_buf);
    req->params_buf = b;
    req->parameters = (oi_slice_t){b->data, b->len};
    return NULL;
}

oi_infer_t *oi_infer_new(void)
{
    oi_infer_t *inf = calloc(1, sizeof(*inf));
    if (inf != NULL)
        inf->req.binary_data_output = -1;
    return inf;
}

void oi_infer_free(oi_infer_t *inf)
{
    if (inf == NULL)
        return;
    oi_response_clear(&inf->job.resp);
    oi_status_free(inf->job.status);
    oi_shm_targets_free(inf->shm_out, inf->req.n_outputs);
    oi_shm_uses_release(&inf->shm_uses);
    oi_request_clear(&inf->req);
    free(inf->output_names);
    oi__dstream_unref(inf->ds);
    free(inf->class_counts);
    oi_model_unref(inf->model);
    if (inf->trace != NULL)
        oi_trace_tensors_free(inf->trace->tensors);
    free(inf->trace);
    free(inf);
}

int oi_infer_trace_begin(oi_infer_t *inf, oi_tracer_t *t, const oi_model_t *m, int grpc, uint64_t recv_start,
                         uint64_t recv_end)
{
    int level = 0;
    uint64_t id = oi_tracer_sample(t, m->name, &level);
    if (id == 0)
        return 0;
    oi_trace_rec_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return -1;
    r->id = id;
    r->level = level;
    r->grpc = grpc;
    r->model_version = m->version;
    snprintf(r->model_name, sizeof(r->model_name), "%s", m->name);
    r->ns[OI_TS_RECV_START] = recv_start;
    r->ns[OI_TS_RECV_END] = recv_end;
    inf->tracer = t;
    inf->trace = r;
    return 0;
}

void oi_infer_trace_end(oi_infer_t *inf, uint64_t send_start)
{
    if (inf->trace == NULL)
        return;
    inf->trace->ns[OI_TS_SEND_START] = send_start;
    inf->trace->ns[OI_TS_SEND_END] = oi_now_ns();
    oi_tracer_push(inf->tracer, inf->trace);
}

/* On the loop thread again. */
static void run_done(oi_task_t *t)
{
    oi_infer_t *inf = (oi_infer_t *)((char *)t - offsetof(oi_infer_t, task));
    if (inf->trace != NULL) { /* the scheduler's times (taken when the request is counted) */
        uint64_t *ns = inf->trace->ns;
        ns[OI_TS_QUEUE_START] = inf->job.times.start;
        ns[OI_TS_COMPUTE_START] = inf->job.times.compute_start;
        ns[OI_TS_COMPUTE_INPUT_END] = inf->job.times.input_end;
        ns[OI_TS_COMPUTE_OUTPUT_START] = inf->job.times.output_start;
        if (inf->job.times.compute_start == 0)
            ns[OI_TS_COMPUTE_END] = 0; /* it never ran */
        ns[OI_TS_REQUEST_END] = oi_now_ns();
    }
    inf->done(inf);
}

/* Replaces the outputs asked as classifications by their top-k (executor thread: sorting is
 * not the loop's work). */
static oi_status_t *classify_outputs(oi_infer_t *inf)
{
    const oi_model_t *m = inf->model;
    for (uint32_t i = 0; i < inf->job.resp.n_outputs; i++) {
        oi_tensor_t *t = &inf->job.resp.outputs[i];
        uint32_t at = oi_name_index(inf->job.output_names, inf->job.n_outputs, t->name);
        if (at == inf->job.n_outputs || inf->class_counts[at] == 0)
            continue;
        const oi_labels_t *labels = NULL;
        for (uint32_t o = 0; m->labels != NULL && o < m->n_outputs; o++)
            if (strcmp(m->outputs[o].name, t->name) == 0)
                labels = m->labels[o];
        oi_status_t *st = oi_classify(t, m->max_batch_size > 0, inf->class_counts[at], labels);
        if (st != NULL)
            return st;
    }
    return NULL;
}

static oi_rcache_request_t cache_request(const oi_infer_t *inf)
{
    const oi_model_t *m = inf->model;
    return (oi_rcache_request_t){m->name, m->version, &inf->req, inf->output_names, inf->job.n_outputs,
                                 inf->class_counts};
}

/* Whether a request may be answered from the model's response cache: not one whose outputs go
 * to shared memory (their bytes are the client's), not a decoupled or sequence model's. */
static int cacheable(const oi_infer_t *inf)
{
    const oi_model_t *m = inf->model;
    return m->cache != NULL && !m->decoupled && m->seq == NULL && inf->shm_out == NULL && inf->post == NULL;
}

/* Executor thread: a missed request's answer goes into the cache (a failure keeps nothing). */
/* Into the model's cache summary (nv_cache_{hit,miss}_summary_per_model) when it has one. */
static void observe_cache(oi_model_t *m, oi_summary_kind_t kind, uint64_t ns, uint64_t now)
{
    oi_summary_t *sum = m->sched != NULL ? oi_scheduler_stats(m->sched)->cache_summary : NULL;
    if (sum != NULL)
        oi_summary_observe_shared(sum, kind, ns / 1000, now);
}

static void keep_in_cache(oi_infer_t *inf)
{
    oi_model_t *m = inf->model;
    uint64_t start = oi_now_ns();
    if (inf->job.status == NULL) {
        oi_rcache_request_t r = cache_request(inf);
        (void)oi_rcache_insert(m->cache, &r, &inf->job.resp);
    }
    uint64_t end = oi_now_ns(), ns = inf->cache_miss_ns + (end - start);
    atomic_fetch_add_explicit(&m->cache_misses, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->cache_miss_ns, ns, memory_order_relaxed);
    observe_cache(m, OI_SUM_CACHE_MISS, ns, end);
}

/* Loop thread: answers from the cache when it holds the answer (1), else notes the miss (0). */
static int answer_from_cache(oi_infer_t *inf)
{
    oi_model_t *m = inf->model;
    uint64_t start = oi_now_ns();
    oi_rcache_request_t r = cache_request(inf);
    if (oi_rcache_lookup(m->cache, &r, &inf->job.resp) != 1) {
        inf->cache_miss_ns = oi_now_ns() - start;
        if (inf->cache_miss_ns == 0)
            inf->cache_miss_ns = 1;
        return 0;
    }
    uint64_t end = oi_now_ns();
    atomic_fetch_add_explicit(&m->cache_hits, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->cache_hit_ns, end - start, memory_order_relaxed);
    observe_cache(m, OI_SUM_CACHE_HIT, end - start, end);
    inf->task.run = run_done;
    oi_loop_post(inf->loop, &inf->task); /* `done` runs after submit has returned, as for a queued one */
    return 1;
}

/* On the thread that ran the backend (an executor, or the loop that submitted), right after. */
static void job_done(oi_job_t *j)
{
    oi_infer_t *inf = (oi_infer_t *)j;
    if (j->status == NULL && inf->ds == NULL) /* a decoupled request's responses went one by one */
        j->status = oi_validate_response(inf->model, j->output_names, j->n_outputs, &j->resp);
    /* Level TENSORS: the outputs as the model gave them, copied here off the loop thread. */
    if (j->status == NULL && inf->trace != NULL && (inf->trace->level & OI_TRACE_TENSORS))
        (void)oi_trace_add_tensors(inf->trace, OI_TRACE_BACKEND_OUTPUT, j->resp.outputs, j->resp.n_outputs);
    /* Outputs asked in shared memory are copied there here, off the loop thread. Response
     * outputs are in the order of the requested ones (see oi_validate_request), some perhaps
     * left out by the model. */
    if (j->status == NULL && inf->shm_out != NULL && inf->ds == NULL)
        j->status = oi_shm_place_outputs(&j->resp, inf->shm_out, j->output_names, j->n_outputs);
    /* A client may have shrunk an object under the model: what was read or written there is
     * lost, and the request says so rather than answer with zeros. */
    if (j->status == NULL && inf->shm != NULL && inf->ds == NULL)
        j->status = oi_shm_check_request(&inf->req, &j->resp);
    /* The request is done with its regions before its answer goes out, so an unregister that
     * waited for it has taken effect by the time the client hears back (a decoupled model may
     * still place responses: its use ends with the request). */
    if (inf->ds == NULL)
        oi_shm_uses_release(&inf->shm_uses);
    if (j->status == NULL && inf->class_counts != NULL)
        j->status = classify_outputs(inf);
    if (j->status == NULL && inf->post != NULL)
        j->status = inf->post(inf);
    if (inf->cache_miss_ns != 0)
        keep_in_cache(inf);
    uint64_t end = j->counted || inf->trace != NULL ? oi_now_ns() : 0;
    if (inf->trace != NULL)
        inf->trace->ns[OI_TS_COMPUTE_END] = end;
    if (j->counted && j->slot != NULL)
        oi_stats_request(j->slot, &j->times, end, j->status == NULL,
                         j->times.compute_start       ? OI_FAIL_BACKEND
                         : atomic_load(&j->cancelled) ? OI_FAIL_CANCELED
                                                      : OI_FAIL_REJECTED,
                         j->rows);
    inf->task.run = run_done;
    oi_loop_post(inf->loop, &inf->task);
}

oi_status_t *oi_model_check_ready(const oi_model_t *m)
{
    if (m->error == NULL && m->sched != NULL)
        return NULL;
    return oi_status_new(OI_UNAVAILABLE, "model '%s' version %s is not ready: %s", m->name, m->version_str,
                         m->error ? m->error : "no executor");
}

static oi_status_t *resolve_shm(oi_infer_t *inf)
{
    if (inf->shm != NULL)
        return oi_shm_resolve(inf->shm, &inf->shm_caller, &inf->req, &inf->shm_out, &inf->shm_uses);
    for (uint32_t i = 0; i < inf->req.n_inputs; i++)
        if (inf->req.inputs[i].shm)
            return oi_status_new(OI_BAD_REQUEST, "input '%s': shared memory is not available here",
                                 inf->req.inputs[i].name);
    return NULL;
}

/* The inferences a request counts for: its batch size (dimension 0) on a batching model, at
 * least 1, as Triton counts them. */
static uint64_t request_rows(const oi_model_t *m, const oi_request_t *req)
{
    if (m->max_batch_size <= 0 || req->n_inputs == 0 || req->inputs[0].ndim < 1 || req->inputs[0].shape[0] < 1)
        return 1;
    return (uint64_t)req->inputs[0].shape[0];
}

oi_status_t *oi_infer_submit(oi_infer_t *inf, oi_model_t *m, oi_loop_t *loop, oi_infer_done_cb done, void *ctx)
{
    inf->model = m;
    oi_status_t *st = oi_model_check_ready(m);
    if (st == NULL)
        st = resolve_shm(inf);
    if (st == NULL && m->decoupled && inf->part == NULL)
        st =
            oi_status_new(OI_UNIMPLEMENTED, "this end point does not support models with decoupled transaction policy");
    if (st == NULL)
        st = oi_validate_request(m, &inf->req, &inf->output_names, &inf->job.n_outputs, &inf->class_counts);
    if (st != NULL)
        return st;
    inf->loop = loop;
    inf->done = done;
    inf->ctx = ctx;
    inf->job.req = &inf->req;
    inf->job.output_names = inf->output_names;
    inf->job.done = job_done;
    inf->job.counted = inf->count_stats;
    inf->job.rows = request_rows(m, &inf->req);
    inf->req.cancelled = oi_job_cancelled;
    inf->req.cancelled_arg = &inf->job;
    if (m->decoupled && oi__dstream_attach(inf) != 0)
        return oi_status_new(OI_INTERNAL, "out of memory");
    if (inf->trace != NULL) {
        inf->trace->ns[OI_TS_REQUEST_START] = oi_now_ns();
        /* Level TENSORS: the inputs as queued (no memory: the trace goes without them). */
        if (inf->trace->level & OI_TRACE_TENSORS)
            (void)oi_trace_add_tensors(inf->trace, OI_TRACE_QUEUE_INPUT, inf->req.inputs, inf->req.n_inputs);
    }
    if (cacheable(inf) && answer_from_cache(inf))
        return NULL;
    if (m->seq != NULL)
        return oi_seq_submit(m->seq, &inf->job);
    /* On the loop thread, which may run a quick model itself (a decoupled one sends its
     * responses through the loop, so never that); after the first request of a turn of the
     * loop only a trivial one: with more requests ready, handing them to the executor, which
     * runs them one after another while the loop reads the next, keeps each thread's code and
     * data in cache. TorchScript `simple`, HTTP JSON, one CPU, against always handing over:
     * 1.19x req/s at 1 connection, 1.04x at 8, 0.99x at 64; running every such request here
     * gave 1.09x at 8 but 0.95x at 64. */
    int first = loop->ran_model_turn != loop->turns;
    int rc = m->decoupled ? oi_scheduler_submit(m->sched, &inf->job)
                          : oi_scheduler_submit_on_loop(m->sched, &inf->job, first);
    if (rc == 1)
        loop->ran_model_turn = loop->turns;
    else if (rc != 0)
        return oi_status_new(OI_UNAVAILABLE, "the server is shutting down");
    return NULL;
}

void oi_infer_cancel(oi_infer_t *inf)
{
    inf->cancelled = 1;
    oi_job_cancel(&inf->job);
    if (inf->model != NULL && inf->model->seq != NULL)
        oi_seq_cancel(inf->model->seq, &inf->job);
    oi__dstream_cancel(inf->ds);
}
