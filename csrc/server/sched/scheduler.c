#include "server/sched/scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec/json.h"
#include "core/thread.h"

typedef struct job_list_s {
    oi_job_t *head;
    oi_job_t *tail;
} job_list_t;

struct oi_scheduler_s {
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* idle executors wait here for a job */
    pthread_cond_t gather_cv; /* the gathering executor waits here for more jobs (monotonic) */
    /* The queue, under mu: two lists per priority level, the highest level first; each
     * level's jobs in arrival order, then those that outwaited a DELAY timeout. Jobs are
     * taken in list order, so list 0's head is the next to run. */
    job_list_t *lists;
    uint32_t *level_count;       /* jobs queued at each level (both its lists) */
    oi_queue_policy_t *policies; /* one per level */
    uint32_t n_levels;           /* >= 1 */
    uint32_t priority_levels;    /* as configured: 0, or n_levels */
    uint32_t default_level;      /* 0-based */
    uint32_t first;              /* lists below this one are empty: scans start here */
    int stopping;
    /* At most one executor gathers a batch at a time, so concurrent instances do not split
     * the queue into small batches; the others run the batches already formed. */
    int gathering;
    oi_batching_t batching;
    const oi_backend_t *backend;
    void *state;
    atomic_int queued;    /* jobs submitted and not yet executing (queued or in a forming batch);
                           * written under mu (a plain add), read by anyone */
    atomic_int next_slot; /* hands each executor its statistics slot */
    /* preserve_ordering: each batch (or lone job) taken off the queue gets the next ticket
     * (under mu); its responses leave only once every earlier ticket's have (under ord_mu). */
    uint64_t next_ticket;
    uint64_t released;
    pthread_mutex_t ord_mu;
    pthread_cond_t ord_cv;
    oi_stats_t *stats;
    oi_job_t **pinned; /* per executor: the batch oi_scheduler_submit_pinned gave it, or NULL */
    /* Jobs may run on the loop thread that submits them (see oi_scheduler_submit): the
     * backend allows it and the model neither batches nor preserves ordering. */
    int run_here;  /* a quick job may run on the thread that submits it (a loop or a BLS caller) */
    int on_loop;   /* ... and that thread may be a loop thread (the backend's runs_on_loop) */
    uint64_t run_here_max_ns;
    int running;          /* executions in progress, on executors and loop threads; under mu */
    char *here_slot_busy; /* per instance: statistics slot instances + i taken by a loop; under mu */
    _Atomic uint64_t recent_ns; /* run_here: the recent executions' average duration (0: none yet) */
    int instances;
    int nthreads;
    pthread_t threads[];
};

#define now_ns oi_now_ns

/* Caller holds mu (or is the last thread): a plain add, no locked instruction. */
static void add_queued(oi_scheduler_t *s, int d)
{
    atomic_store_explicit(&s->queued, atomic_load_explicit(&s->queued, memory_order_relaxed) + d, memory_order_relaxed);
}

/* Appends to list k. */
static void append(oi_scheduler_t *s, uint32_t k, oi_job_t *j)
{
    job_list_t *l = &s->lists[k];
    if (k < s->first)
        s->first = k;
    j->next = NULL;
    if (l->tail)
        l->tail->next = j;
    else
        l->head = j;
    l->tail = j;
}

/* Takes `j` (after `prev`, NULL for the head) out of list l. It stays counted at its level:
 * callers moving it to the delayed list keep the count; the others call uncount. */
static void unlink_job(job_list_t *l, oi_job_t *prev, oi_job_t *j)
{
    if (prev)
        prev->next = j->next;
    else
        l->head = j->next;
    if (l->tail == j)
        l->tail = prev;
    j->next = NULL;
}

static void uncount(oi_scheduler_t *s, const oi_job_t *j)
{
    s->level_count[j->level]--;
}

/* The first list holding a job, or -1 when the queue is empty. Starts at `first`, so a
 * queue with many priority levels is not scanned from the top for every job. */
static int first_list(oi_scheduler_t *s)
{
    for (; s->first < 2 * s->n_levels; s->first++)
        if (s->lists[s->first].head != NULL)
            return (int)s->first;
    return -1;
}

/* Takes the next job in queue order, or NULL. */
static oi_job_t *pop_locked(oi_scheduler_t *s)
{
    int k = first_list(s);
    if (k < 0)
        return NULL;
    oi_job_t *j = s->lists[k].head;
    unlink_job(&s->lists[k], NULL, j);
    uncount(s, j);
    return j;
}

int oi_job_cancelled(const void *job)
{
    return atomic_load(&((const oi_job_t *)job)->cancelled);
}

void oi_job_cancel(oi_job_t *job)
{
    atomic_store(&job->cancelled, 1);
}

static int expired(const oi_job_t *j)
{
    return j->expires_ns != 0 && now_ns() >= j->expires_ns;
}

/* Whether a job must not run: its clients have gone, or it waited past a REJECT timeout. */
static int unwanted(const oi_job_t *j)
{
    return atomic_load(&j->cancelled) || (!j->delay && expired(j));
}

/* Whether a job still in its level's first list has outwaited a DELAY timeout: it then moves
 * behind the level's timely jobs (Triton's delayed queue). */
static int to_delay(const oi_job_t *j)
{
    return j->delay && !j->delayed && expired(j);
}

/* Moves a job, already unlinked from its level's first list, to the level's delayed list. */
static void delay_job(oi_scheduler_t *s, oi_job_t *j)
{
    j->delayed = 1;
    append(s, 2 * j->level + 1, j);
}

/* Puts a job that will not run on the list `finish_dropped` completes. */
static void drop(oi_job_t **dropped, oi_job_t *j)
{
    j->next = *dropped;
    *dropped = j;
}

static int list_len(const oi_job_t *j)
{
    int n = 0;
    for (; j != NULL; j = j->next)
        n++;
    return n;
}

/* Completes jobs taken off the queue unrun, with Triton's status for a queue timeout or ours
 * for a cancellation, counted in `slot` (the executor's). Outside the lock: `done` hands each
 * back to its owner. */
static void finish_dropped(oi_stats_slot_t *slot, oi_job_t *j)
{
    for (oi_job_t *next; j != NULL; j = next) {
        next = j->next;
        j->next = NULL;
        j->status = atomic_load(&j->cancelled) ? oi_status_new(OI_CLIENT_CLOSED, "the request was cancelled")
                                               : oi_status_new(OI_UNAVAILABLE, "Request timeout expired");
        j->slot = slot;
        j->done(j);
    }
}

/* The next job in queue order that is still wanted; the unwanted ones before it go to
 * `dropped`, and those past a DELAY timeout move behind their level's timely jobs. */
static oi_job_t *pop_wanted_locked(oi_scheduler_t *s, oi_job_t **dropped)
{
    int k;
    while ((k = first_list(s)) >= 0) {
        oi_job_t *j = s->lists[k].head;
        unlink_job(&s->lists[k], NULL, j);
        if (to_delay(j)) {
            delay_job(s, j);
            continue;
        }
        uncount(s, j);
        if (!unwanted(j))
            return j;
        drop(dropped, j);
    }
    return NULL;
}

/* preserve_ordering: waits until the responses of every batch taken before ticket `t` have
 * left. The executor that ran an earlier batch always reaches end_turn, so this ends. */
static void await_turn(oi_scheduler_t *s, uint64_t t)
{
    if (!s->batching.preserve_ordering)
        return;
    pthread_mutex_lock(&s->ord_mu);
    while (s->released != t)
        pthread_cond_wait(&s->ord_cv, &s->ord_mu);
    pthread_mutex_unlock(&s->ord_mu);
}

/* The responses of ticket `t` have left (or it had none): the next ticket's may. */
static void end_turn(oi_scheduler_t *s, uint64_t t)
{
    if (!s->batching.preserve_ordering)
        return;
    pthread_mutex_lock(&s->ord_mu);
    while (s->released != t)
        pthread_cond_wait(&s->ord_cv, &s->ord_mu);
    s->released++;
    pthread_cond_broadcast(&s->ord_cv);
    pthread_mutex_unlock(&s->ord_mu);
}

/* Runs one job alone. `went_on_at` is when the executor's previous request ended if it went
 * straight on to this one without waiting (0 otherwise): under load the job then starts
 * there (or when it was queued, if later), which saves a clock read per request. */
static void run_one(oi_scheduler_t *s, oi_stats_slot_t *slot, oi_job_t *j, uint64_t went_on_at, uint64_t ticket)
{
    if (atomic_load(&j->cancelled)) { /* cancelled between the queue and here */
        finish_dropped(slot, j);
        return;
    }
    int counted = j->counted;
    uint64_t rows = j->rows, start = 0;
    if (counted)
        start = went_on_at == 0 ? now_ns() : went_on_at > j->times.start ? went_on_at : j->times.start;
    uint64_t began = s->run_here ? (counted && went_on_at == 0 ? start : now_ns()) : 0;
    j->status = s->backend->execute(s->state, j->req, j->output_names, j->n_outputs, &j->resp);
    int ran = j->status == NULL;
    if (s->run_here) { /* an average over the last few (weight 1/8): racy updates only blur it */
        int64_t took = (int64_t)(now_ns() - began);
        int64_t avg = (int64_t)atomic_load_explicit(&s->recent_ns, memory_order_relaxed);
        atomic_store_explicit(&s->recent_ns, (uint64_t)(avg == 0 ? took : avg + (took - avg) / 8), memory_order_relaxed);
    }
    if (!counted) {
        await_turn(s, ticket);
        j->done(j);
        return;
    }
    uint64_t out_start = now_ns();
    j->times.compute_start = j->times.input_end = start;
    j->times.output_start = out_start;
    j->slot = slot;
    await_turn(s, ticket);
    j->done(j); /* the job may be gone now; it noted when it ended in the slot */
    if (ran)
        oi_stats_execution(slot, rows, start, start, out_start, slot->last_end);
}

/* ---- dynamic batching ------------------------------------------------------------------- */

typedef struct batch_s {
    oi_job_t *first;
    oi_job_t *last;
    int n_jobs;
    int64_t rows;
    int saturated; /* the next queued job cannot join: the batch goes now, as Triton's does */
} batch_t;

/* Rows (dimension 0) of a request, or -1 when it cannot join a batch. Validation has
 * checked that every input has the same dimension 0 within max_batch_size. */
static int64_t job_rows(const oi_job_t *j)
{
    const oi_request_t *r = j->req;
    if (r->n_inputs == 0 || r->inputs[0].ndim < 1)
        return -1;
    return r->inputs[0].shape[0];
}

int oi_jobs_batchable(const oi_job_t *a, const oi_job_t *b)
{
    const oi_request_t *x = a->req, *y = b->req;
    if (x->n_inputs != y->n_inputs || a->n_outputs != b->n_outputs)
        return 0;
    for (uint32_t i = 0; i < x->n_inputs; i++) {
        const oi_tensor_t *s = &x->inputs[i], *t = &y->inputs[i];
        if (s->dtype != t->dtype || s->ndim != t->ndim || s->ndim < 1 || strcmp(s->name, t->name) != 0)
            return 0;
        for (int d = 1; d < s->ndim; d++)
            if (s->shape[d] != t->shape[d])
                return 0;
    }
    for (uint32_t i = 0; i < a->n_outputs; i++)
        if (strcmp(a->output_names[i], b->output_names[i]) != 0)
            return 0;
    return 1;
}

static int compatible(const oi_scheduler_t *sched, const oi_job_t *a, const oi_job_t *b)
{
    const oi_request_t *x = a->req, *y = b->req;
    if (!oi_jobs_batchable(a, b))
        return 0;
    if (sched->batching.ignore_parameters)
        return 1;
    if (x->parameters.len == y->parameters.len &&
        (x->parameters.len == 0 || memcmp(x->parameters.ptr, y->parameters.ptr, x->parameters.len) == 0))
        return 1;
    /* The parameters the scheduler itself acts on differ between requests that can share a
     * batch, as in Triton: a batch runs with the first request's other parameters. */
    static const char *const scheduling[] = {"priority", "timeout", NULL};
    return oi_json_params_same(x->parameters, y->parameters, scheduling);
}

/* Moves queued jobs that fit into the batch, in queue order (higher priority levels first).
 * A compatible job that does not fit ends the scan, so a large request is never overtaken by
 * later small ones forever. A job that cannot join (other inputs, shapes, outputs or
 * parameters) ends it too and saturates the batch: as Triton's dynamic batcher
 * (dynamic_batch_scheduler.cc) sends the pending batch at once rather than hold it for the
 * queue delay. Caller holds the lock. */
static void gather_locked(oi_scheduler_t *s, batch_t *b, oi_job_t **dropped)
{
    for (uint32_t k = s->first; k < 2 * s->n_levels; k++) {
        job_list_t *l = &s->lists[k];
        oi_job_t *prev = NULL, *j = l->head;
        while (j != NULL) {
            if (b->rows >= s->batching.max_batch_size)
                return;
            oi_job_t *next = j->next;
            if (to_delay(j)) { /* a later list of this scan reaches it again */
                unlink_job(l, prev, j);
                delay_job(s, j);
                j = next;
                continue;
            }
            int64_t rows = job_rows(j);
            int gone = unwanted(j);
            if (!gone && (rows < 0 || !compatible(s, b->first, j))) {
                b->saturated = 1;
                return;
            }
            if (!gone && b->rows + rows > s->batching.max_batch_size)
                return;
            unlink_job(l, prev, j);
            uncount(s, j);
            if (gone) {
                drop(dropped, j);
            } else {
                b->last->next = j;
                b->last = j;
                b->n_jobs++;
                b->rows += rows;
            }
            j = next;
        }
    }
}

static int batch_ready(const oi_scheduler_t *s, const batch_t *b)
{
    if (b->rows >= s->batching.max_batch_size)
        return 1;
    for (int i = 0; i < s->batching.n_preferred; i++)
        if (b->rows == s->batching.preferred[i])
            return 1;
    return 0;
}

static void fail_batch(batch_t *b, const oi_status_t *st)
{
    for (oi_job_t *j = b->first; j; j = j->next)
        j->status = oi_status_new(st->code, "%s", st->message);
}

/* Gives each job the backend failed alone (errors[k], see oi_request_t.batch_errors) its own
 * status instead of its rows. */
static void fail_some(batch_t *b, oi_status_t **errors)
{
    int k = 0;
    for (oi_job_t *j = b->first; j; j = j->next, k++)
        if (errors[k] != NULL) {
            oi_response_clear(&j->resp);
            j->status = errors[k];
            errors[k] = NULL;
        }
}

/* Gives each job the response parameters the backend made for it alone (params[k], see
 * oi_request_t.batch_resp_params), as Triton sends each response of a batch with its own. */
static void give_parameters(batch_t *b, oi_buf_t **params)
{
    int k = 0;
    for (oi_job_t *j = b->first; j; j = j->next, k++)
        if (params[k] != NULL && j->status == NULL) {
            oi_buf_unref(j->resp.parameters);
            j->resp.parameters = params[k];
            params[k] = NULL;
        }
}

/* Leaves out of each job's response the outputs the backend says its own response lacked
 * (absent[k * n + i], see oi_request_t.batch_absent). */
static void leave_out(batch_t *b, const uint8_t *absent, uint32_t n)
{
    uint32_t k = 0;
    for (oi_job_t *j = b->first; j; j = j->next, k++)
        for (uint32_t i = 0; i < n && i < j->resp.n_outputs; i++)
            if (absent[k * n + i]) {
                oi_tensor_clear(&j->resp.outputs[i]);
                j->resp.outputs[i].absent = 1;
            }
}

/* Whether the backend failed every job of the batch alone: then each gets its own status and
 * the outputs (which need not be there) are not looked at. */
static int failed_each(batch_t *b, oi_status_t **errors)
{
    for (int k = 0; k < b->n_jobs; k++)
        if (errors[k] == NULL)
            return 0;
    fail_some(b, errors);
    return 1;
}

/* Splits one batched output along dimension 0 into each job's response: views of the same
 * memory, each holding a reference to its owner. One the model left out is left out of each. */
static oi_status_t *split_output(batch_t *b, const oi_tensor_t *t, uint32_t i)
{
    if (t->absent) {
        for (oi_job_t *j = b->first; j; j = j->next) {
            j->resp.outputs[i] = (oi_tensor_t){.name = j->output_names[i], .absent = 1};
            j->resp.n_outputs = i + 1;
        }
        return NULL;
    }
    if (t->ndim < 1 || t->shape[0] != b->rows)
        return oi_status_new(OI_INTERNAL, "output '%s' of a batch of %lld rows has %s%lld rows; a batching model "
                             "must keep dimension 0", t->name, (long long)b->rows, t->ndim < 1 ? "no dimension 0, not " : "",
                             t->ndim < 1 ? 0LL : (long long)t->shape[0]);
    int64_t per_row = 1;
    for (int d = 1; d < t->ndim; d++)
        per_row *= t->shape[d];
    size_t esize = oi_dtype_size(t->dtype);
    if (esize != 0 && (uint64_t)b->rows * (uint64_t)per_row * esize != t->byte_size)
        return oi_status_new(OI_INTERNAL, "output '%s': %zu bytes do not fit its shape", t->name, t->byte_size);
    size_t off = 0;
    for (oi_job_t *j = b->first; j; j = j->next) {
        int64_t rows = job_rows(j);
        size_t len;
        if (esize != 0) {
            len = (size_t)rows * (size_t)per_row * esize;
        } else { /* BYTES: walk the elements of these rows */
            size_t end = off;
            for (int64_t e = 0; e < rows * per_row; e++) {
                uint32_t n;
                if (t->byte_size - end < 4)
                    return oi_status_new(OI_INTERNAL, "output '%s': truncated BYTES element", t->name);
                memcpy(&n, t->data + end, 4);
                if (n > t->byte_size - end - 4)
                    return oi_status_new(OI_INTERNAL, "output '%s': truncated BYTES element", t->name);
                end += 4 + n;
            }
            len = end - off;
        }
        oi_tensor_t *o = &j->resp.outputs[i];
        o->name = j->output_names[i];
        o->dtype = t->dtype;
        o->ndim = t->ndim;
        memcpy(o->shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
        o->shape[0] = rows;
        o->byte_size = len;
        o->data = len ? t->data + off : NULL;
        o->owner = len ? oi_buf_ref(t->owner) : NULL;
        j->resp.n_outputs = i + 1;
        off += len;
    }
    return NULL;
}

/* A batch is cancelled once every job in it is. */
static int batch_cancelled(const void *arg)
{
    for (const oi_job_t *j = ((const batch_t *)arg)->first; j; j = j->next)
        if (!atomic_load(&j->cancelled))
            return 0;
    return 1;
}

/* Concatenates the jobs' inputs along dimension 0 (the one copy batching costs), runs the
 * batch once and splits the outputs back. Sets every job's status; does not call done. When
 * `times` is given, fills in when the inputs were ready and when the model returned; returns
 * whether the model ran without error. */
static int run_batched(oi_scheduler_t *s, batch_t *b, oi_stats_times_t *times)
{
    int ran = 0;
    const oi_request_t *r0 = b->first->req;
    oi_request_t breq = {0};
    oi_response_t bresp = {0};
    oi_status_t *st = NULL;
    breq.binary_data_output = -1;
    breq.parameters = r0->parameters;
    breq.cancelled = batch_cancelled;
    breq.cancelled_arg = b;
    int64_t *rows = malloc((size_t)b->n_jobs * sizeof(*rows));
    const char **ids = malloc((size_t)b->n_jobs * sizeof(*ids));
    oi_slice_t *params = malloc((size_t)b->n_jobs * sizeof(*params));
    oi_status_t **errors = calloc((size_t)b->n_jobs, sizeof(*errors));
    oi_buf_t **resp_params = calloc((size_t)b->n_jobs, sizeof(*resp_params));
    uint8_t *absent = calloc((size_t)b->n_jobs * (b->first->n_outputs ? b->first->n_outputs : 1), 1);
    if (rows != NULL && ids != NULL && params != NULL && errors != NULL && resp_params != NULL && absent != NULL) {
        uint32_t k = 0;
        for (oi_job_t *j = b->first; j; j = j->next, k++) {
            rows[k] = job_rows(j);
            ids[k] = j->req->id;
            params[k] = j->req->parameters;
            if (j->req->bls_chain != NULL && (breq.bls_chain == NULL || strlen(j->req->bls_chain) > strlen(breq.bls_chain)))
                breq.bls_chain = j->req->bls_chain;
        }
        breq.batch_rows = rows;
        breq.batch_ids = ids;
        breq.batch_params = params;
        breq.batch_errors = errors;
        breq.batch_resp_params = resp_params;
        breq.batch_absent = absent;
        breq.n_batch = k;
    }
    breq.inputs = calloc(r0->n_inputs, sizeof(oi_tensor_t));
    if (breq.inputs == NULL || breq.n_batch == 0) {
        st = oi_status_new(OI_INTERNAL, "out of memory");
        goto done;
    }
    for (uint32_t i = 0; i < r0->n_inputs; i++) {
        size_t total = 0;
        for (oi_job_t *j = b->first; j; j = j->next)
            total += j->req->inputs[i].byte_size;
        oi_tensor_t *t = &breq.inputs[i];
        *t = r0->inputs[i];
        t->shape[0] = b->rows;
        t->owner = oi_buf_new(total);
        breq.n_inputs = i + 1;
        if (t->owner == NULL) {
            t->data = NULL;
            st = oi_status_new(OI_INTERNAL, "out of memory");
            goto done;
        }
        t->data = t->owner->data;
        t->byte_size = t->owner->len = total;
        size_t off = 0;
        for (oi_job_t *j = b->first; j; j = j->next) {
            const oi_tensor_t *src = &j->req->inputs[i];
            if (src->byte_size)
                memcpy(t->data + off, src->data, src->byte_size);
            off += src->byte_size;
        }
    }
    if (times != NULL)
        times->input_end = now_ns();
    st = s->backend->execute(s->state, &breq, b->first->output_names, b->first->n_outputs, &bresp);
    if (times != NULL)
        times->output_start = now_ns();
    if (failed_each(b, errors)) { /* each its own error: what else the backend says is moot */
        oi_status_free(st);
        st = NULL;
        ran = 1;
        goto done;
    }
    if (st != NULL)
        goto done;
    ran = 1;
    if (bresp.n_outputs != b->first->n_outputs) {
        st = oi_status_new(OI_INTERNAL, "the model produced %u outputs, expected %u", bresp.n_outputs,
                           b->first->n_outputs);
        goto done;
    }
    for (oi_job_t *j = b->first; j; j = j->next)
        if ((j->resp.outputs = calloc(bresp.n_outputs ? bresp.n_outputs : 1, sizeof(oi_tensor_t))) == NULL) {
            st = oi_status_new(OI_INTERNAL, "out of memory");
            goto done;
        }
    for (uint32_t i = 0; i < bresp.n_outputs && st == NULL; i++)
        st = split_output(b, &bresp.outputs[i], i);
    if (st == NULL) {
        fail_some(b, errors);
        give_parameters(b, resp_params);
        leave_out(b, absent, b->first->n_outputs);
    }
done:
    if (st != NULL) {
        for (oi_job_t *j = b->first; j; j = j->next)
            oi_response_clear(&j->resp);
        fail_batch(b, st);
        oi_status_free(st);
    }
    oi_response_clear(&bresp);
    oi_request_clear(&breq); /* its names are the first job's: clear before any done */
    for (int k = 0; errors != NULL && k < b->n_jobs; k++)
        oi_status_free(errors[k]); /* those fail_some did not hand on */
    for (int k = 0; resp_params != NULL && k < b->n_jobs; k++)
        oi_buf_unref(resp_params[k]); /* those give_parameters did not */
    free(rows);
    free(ids);
    free(params);
    free(errors);
    free(resp_params);
    free(absent);
    return ran;
}

/* Takes the jobs cancelled while the batch formed out of it (they complete unrun). */
static void drop_cancelled(oi_stats_slot_t *slot, batch_t *b)
{
    oi_job_t *dropped = NULL, **link = &b->first;
    b->last = NULL;
    b->n_jobs = 0;
    b->rows = 0;
    while (*link != NULL) {
        oi_job_t *j = *link;
        if (atomic_load(&j->cancelled)) {
            *link = j->next;
            drop(&dropped, j);
            continue;
        }
        b->last = j;
        b->n_jobs++;
        b->rows += job_rows(j);
        link = &j->next;
    }
    finish_dropped(slot, dropped);
}

/* `pinned`: a Direct sequence batch, whose rows keep their places (none is dropped). */
static void run_batch(oi_scheduler_t *s, oi_stats_slot_t *slot, batch_t *b, uint64_t ticket, int pinned)
{
    if (b->n_jobs > 1 && !pinned)
        drop_cancelled(slot, b);
    if (b->n_jobs == 0)
        return;
    if (b->n_jobs == 1) {
        run_one(s, slot, b->first, 0, ticket);
        return;
    }
    /* The server counts all of a batch's requests or none; a Direct batch's padding rows are
     * never counted. */
    int counted = 0;
    uint64_t rows = 0;
    for (oi_job_t *j = b->first; j; j = j->next)
        if (j->counted) {
            counted = 1;
            rows += j->rows;
        }
    oi_stats_times_t t = {0};
    if (counted)
        t.compute_start = now_ns();
    int ran = run_batched(s, b, counted ? &t : NULL);
    await_turn(s, ticket);
    for (oi_job_t *j = b->first, *next; j; j = next) {
        next = j->next;
        j->next = NULL;
        if (j->counted) {
            j->times.compute_start = t.compute_start;
            j->times.input_end = t.input_end;
            j->times.output_start = t.output_start;
            j->slot = slot;
        }
        j->done(j);
    }
    if (counted && ran) /* the batch ended with its last request */
        oi_stats_execution(slot, rows, t.compute_start, t.input_end, t.output_start, slot->last_end);
}

/* Forms the next batch from the queue head: takes what fits now, then waits for more until
 * the batch is full or of a preferred size, or the oldest job's delay is spent. Called with
 * the lock held and the queue non-empty; returns with the lock held. */
static void gather_batch(oi_scheduler_t *s, batch_t *b, oi_job_t **dropped)
{
    oi_job_t *first = pop_wanted_locked(s, dropped);
    if (first == NULL) {
        *b = (batch_t){0};
        return;
    }
    *b = (batch_t){first, first, 1, job_rows(first)};
    if (b->rows < 0) /* cannot batch: runs alone */
        return;
    s->gathering = 1;
    uint64_t deadline = first->enqueued_ns + s->batching.max_queue_delay_us * 1000u;
    for (;;) {
        gather_locked(s, b, dropped);
        if (batch_ready(s, b) || b->saturated || s->stopping)
            break;
        uint64_t now = now_ns();
        if (now >= deadline)
            break;
        struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
        pthread_cond_timedwait(&s->gather_cv, &s->mu, &ts);
    }
    s->gathering = 0;
    if (first_list(s) >= 0) /* the next batch can start forming on another executor */
        pthread_cond_signal(&s->cv);
}

/* Runs a batch oi_scheduler_submit_pinned gave this executor (its rows: one each, or a lone
 * job of a model without batching). */
static void run_pinned(oi_scheduler_t *s, oi_stats_slot_t *slot, oi_job_t *jobs)
{
    batch_t b = {jobs, jobs, 0, 0};
    for (oi_job_t *j = jobs; j; j = j->next) {
        b.last = j;
        b.n_jobs++;
    }
    b.rows = b.n_jobs;
    run_batch(s, slot, &b, 0, 1);
}

static void *executor(void *arg)
{
    oi_scheduler_t *s = arg;
    int batching = s->batching.max_batch_size > 0;
    int me = atomic_fetch_add(&s->next_slot, 1); /* also this executor's instance */
    oi_stats_slot_t *slot = &s->stats->slots[me];
    slot->last_end = 0;
    oi_thread_set_instance(me);
    oi_thread_prefer_batch();
    int ran = 0; /* this executor's execution still counts in s->running */
    for (;;) {
        int waited = 0;
        pthread_mutex_lock(&s->mu);
        s->running -= ran;
        ran = 0;
        /* With a job running on a loop thread, every instance may be busy: wait for one. */
        while (s->pinned[me] == NULL && (first_list(s) < 0 || s->gathering || s->running >= s->instances) &&
               !s->stopping) {
            pthread_cond_wait(&s->cv, &s->mu);
            waited = 1;
        }
        if (s->stopping) {
            pthread_mutex_unlock(&s->mu);
            if (s->backend->thread_end != NULL)
                s->backend->thread_end(s->state);
            return NULL;
        }
        oi_job_t *pinned = s->pinned[me];
        if (pinned != NULL) {
            s->pinned[me] = NULL;
            s->running += ran = 1;
            pthread_mutex_unlock(&s->mu);
            run_pinned(s, slot, pinned);
            continue;
        }
        oi_job_t *dropped = NULL;
        if (!batching) {
            oi_job_t *j = pop_wanted_locked(s, &dropped);
            add_queued(s, -(list_len(dropped) + (j != NULL)));
            uint64_t ticket = j != NULL ? s->next_ticket++ : 0;
            s->running += ran = j != NULL;
            pthread_mutex_unlock(&s->mu);
            finish_dropped(slot, dropped);
            if (j != NULL) {
                run_one(s, slot, j, waited || dropped ? 0 : slot->last_end, ticket);
                end_turn(s, ticket);
            }
            continue;
        }
        batch_t b;
        gather_batch(s, &b, &dropped);
        add_queued(s, -(b.n_jobs + list_len(dropped)));
        uint64_t ticket = b.n_jobs > 0 ? s->next_ticket++ : 0;
        s->running += ran = b.n_jobs > 0;
        pthread_mutex_unlock(&s->mu);
        finish_dropped(slot, dropped);
        if (b.n_jobs > 0) {
            run_batch(s, slot, &b, ticket, 0);
            end_turn(s, ticket);
        }
    }
}

/* OPENINFER_RUN_ON_LOOP_MAX_US, else OI_RUN_HERE_MAX_NS (also for a value that is not a
 * whole number of microseconds); 0 turns running on loops off. */
static uint64_t run_here_max_ns(void)
{
    const char *v = getenv("OPENINFER_RUN_ON_LOOP_MAX_US");
    char *end = NULL;
    unsigned long long us = v != NULL && *v >= '0' && *v <= '9' ? strtoull(v, &end, 10) : 0;
    if (end == NULL || *end != '\0' || us > UINT64_MAX / 1000u)
        return OI_RUN_HERE_MAX_NS;
    return (uint64_t)us * 1000u;
}

oi_scheduler_t *oi_scheduler_new_batching(const oi_backend_t *backend, void *state, int instances,
                                          const oi_batching_t *batching, char *err, size_t errlen)
{
    if (instances < 1)
        instances = 1;
    oi_scheduler_t *s = calloc(1, sizeof(*s) + (size_t)instances * sizeof(pthread_t));
    if (s == NULL || (s->pinned = calloc((size_t)instances, sizeof(oi_job_t *))) == NULL) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    s->instances = instances;
    s->run_here_max_ns = run_here_max_ns();
    s->on_loop = backend->runs_on_loop;
    s->run_here = s->run_here_max_ns > 0 && (backend->runs_on_loop || backend->runs_on_caller) &&
                  (batching == NULL || (batching->max_batch_size <= 0 && !batching->preserve_ordering));
    if (s->run_here && (s->here_slot_busy = calloc((size_t)instances, 1)) == NULL) {
        free(s->pinned);
        free(s);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->ord_mu, NULL);
    pthread_cond_init(&s->ord_cv, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->gather_cv, &attr);
    pthread_condattr_destroy(&attr);
    if (batching != NULL) {
        s->batching = *batching;
        if (s->batching.n_preferred < 0 || s->batching.n_preferred > 16)
            s->batching.n_preferred = 0;
    }
    s->batching.policies = NULL; /* borrowed: copied below */
    if (batching != NULL && batching->n_levels > 0 && batching->policies != NULL) {
        s->n_levels = s->priority_levels = batching->n_levels;
        s->default_level = batching->default_level >= 1 && batching->default_level <= batching->n_levels
                               ? batching->default_level - 1
                               : 0;
    } else {
        s->n_levels = 1;
    }
    s->lists = calloc(2 * (size_t)s->n_levels, sizeof(job_list_t));
    s->level_count = calloc(s->n_levels, sizeof(uint32_t));
    s->policies = calloc(s->n_levels, sizeof(oi_queue_policy_t));
    if (s->lists == NULL || s->level_count == NULL || s->policies == NULL) {
        snprintf(err, errlen, "out of memory");
        oi_scheduler_free(s);
        return NULL;
    }
    if (s->priority_levels > 0)
        memcpy(s->policies, batching->policies, s->n_levels * sizeof(oi_queue_policy_t));
    else /* no queue policy: the request's own timeout applies, as it always has */
        s->policies[0] = (oi_queue_policy_t){0, 0, 1, s->batching.max_queue_size};
    s->backend = backend;
    s->state = state;
    s->stats = oi_stats_new(s->run_here ? 2 * instances : instances); /* then the loops' slots too */
    if (s->stats == NULL) {
        snprintf(err, errlen, "out of memory");
        oi_scheduler_free(s);
        return NULL;
    }
    for (int i = 0; i < instances; i++) {
        int rc = oi_thread_create(&s->threads[i], "oi-exec", executor, s, 0);
        if (rc != 0) {
            snprintf(err, errlen, "cannot start an executor thread: %s", strerror(rc));
            oi_scheduler_free(s);
            return NULL;
        }
        s->nthreads++;
    }
    return s;
}

oi_stats_t *oi_scheduler_stats(const oi_scheduler_t *s) { return s->stats; }

int oi_scheduler_pending(const oi_scheduler_t *s) { return atomic_load_explicit(&s->queued, memory_order_relaxed); }

/* Runs a job on the submitting thread, as an executor would, taking an instance and a
 * statistics slot of the loops' own for the time. Called with mu held; unlocks it. */
static void run_here(oi_scheduler_t *s, oi_job_t *job)
{
    int k = 0;
    while (s->here_slot_busy[k]) /* fewer than `instances` run, so one is free */
        k++;
    s->here_slot_busy[k] = 1;
    s->running++;
    pthread_mutex_unlock(&s->mu);
    run_one(s, &s->stats->slots[s->instances + k], job, 0, 0);
    pthread_mutex_lock(&s->mu);
    s->here_slot_busy[k] = 0;
    s->running--;
    if (first_list(s) >= 0) /* a job queued meanwhile may have found every instance busy */
        pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Runs the job on the calling thread when the model's recent executions average less than
 * `here_below_ns` (0: never) and the other conditions of oi_scheduler_submit_on_loop hold. */
static int submit(oi_scheduler_t *s, oi_job_t *job, uint64_t here_below_ns)
{
    job->next = NULL;
    job->status = NULL;
    job->slot = NULL;
    uint64_t prio = job->req->priority;
    uint32_t level = prio >= 1 && prio <= s->priority_levels ? (uint32_t)prio - 1 : s->default_level;
    const oi_queue_policy_t *policy = &s->policies[level];
    uint64_t timeout_us =
        policy->allow_override && job->req->timeout_us ? job->req->timeout_us : policy->default_timeout_us;
    job->level = level;
    job->delay = (uint8_t)(policy->delay != 0);
    job->delayed = 0;
    int timed = s->batching.max_batch_size > 0 || job->counted;
    uint64_t now = timed || timeout_us ? now_ns() : 0;
    job->enqueued_ns = timed ? now : 0;
    job->times = (oi_stats_times_t){job->enqueued_ns, 0, 0, 0};
    /* A timeout too long to represent is no limit. */
    job->expires_ns = timeout_us && timeout_us < (UINT64_MAX - now) / 1000u ? now + timeout_us * 1000u : 0;
    atomic_store(&job->cancelled, 0);
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    if (policy->max_queue_size != 0 && s->level_count[level] >= policy->max_queue_size) {
        pthread_mutex_unlock(&s->mu);
        /* Outside the lock: `done` hands the job back to its owner. */
        job->status = oi_status_new(OI_UNAVAILABLE, "Exceeds maximum queue size");
        job->slot = &s->stats->shared;
        job->done(job);
        return 0;
    }
    if (here_below_ns && s->run_here && first_list(s) < 0 && s->running < s->instances) {
        uint64_t recent = atomic_load_explicit(&s->recent_ns, memory_order_relaxed);
        if (recent != 0 && recent < here_below_ns) {
            run_here(s, job); /* unlocks */
            return 1;
        }
    }
    add_queued(s, 1);
    s->level_count[level]++;
    append(s, 2 * level, job);
    pthread_cond_signal(s->gathering ? &s->gather_cv : &s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int oi_scheduler_submit(oi_scheduler_t *s, oi_job_t *job) { return submit(s, job, 0); } /* never 1 */

int oi_scheduler_submit_on_loop(oi_scheduler_t *s, oi_job_t *job, int first)
{
    uint64_t limit = s->run_here_max_ns;
    if (!first && limit > OI_RUN_ALWAYS_HERE_NS)
        limit = OI_RUN_ALWAYS_HERE_NS;
    return submit(s, job, s->on_loop ? limit : 0);
}

int oi_scheduler_submit_on_caller(oi_scheduler_t *s, oi_job_t *job) { return submit(s, job, s->run_here_max_ns); }

int oi_scheduler_submit_pinned(oi_scheduler_t *s, oi_job_t *jobs, int instance)
{
    uint64_t now = now_ns();
    for (oi_job_t *j = jobs; j; j = j->next) {
        /* `cancelled` is the submitter's: a padding row is cancelled from the start, so that
         * the batch counts as cancelled once every real row is. */
        j->status = NULL;
        j->slot = NULL;
        j->level = 0;
        j->delay = j->delayed = 0;
        j->expires_ns = 0; /* the sequence batcher applied the request's timeout */
        j->enqueued_ns = now;
        j->times = (oi_stats_times_t){now, 0, 0, 0};
    }
    pthread_mutex_lock(&s->mu);
    if (s->stopping || instance < 0 || instance >= s->instances || s->pinned[instance] != NULL) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    s->pinned[instance] = jobs;
    pthread_cond_broadcast(&s->cv); /* the one executor that must wake is among them */
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* Completes jobs that never ran with 503, outside the lock. */
static void fail_unrun(oi_scheduler_t *s, oi_job_t *j)
{
    for (oi_job_t *next; j != NULL; j = next) {
        next = j->next;
        j->next = NULL;
        j->status = oi_status_new(OI_UNAVAILABLE, "the server is shutting down");
        j->slot = s->stats ? &s->stats->shared : NULL;
        j->done(j);
    }
}

/* Takes every pinned batch (for fail_unrun, in row order batch after batch). Under the lock. */
static oi_job_t *take_pinned_locked(oi_scheduler_t *s)
{
    oi_job_t *all = NULL, **tail = &all;
    for (int i = 0; i < s->instances; i++) {
        *tail = s->pinned[i];
        s->pinned[i] = NULL;
        while (*tail != NULL)
            tail = &(*tail)->next;
    }
    return all;
}

void oi_scheduler_cancel_queued(oi_scheduler_t *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    oi_job_t *queued = NULL, *j;
    while ((j = pop_locked(s)) != NULL) { /* reversed: all fail alike */
        add_queued(s, -1);
        drop(&queued, j);
    }
    oi_job_t *pinned = take_pinned_locked(s);
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->gather_cv);
    pthread_mutex_unlock(&s->mu);
    /* Outside the lock: `done` hands the job back to its owner, which may free it. */
    fail_unrun(s, queued);
    fail_unrun(s, pinned);
}

void oi_scheduler_free(oi_scheduler_t *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->gather_cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    /* The executors are gone: no lock needed. */
    oi_job_t *queued = NULL, *j;
    while (s->lists != NULL && (j = pop_locked(s)) != NULL) {
        add_queued(s, -1);
        drop(&queued, j);
    }
    fail_unrun(s, queued);
    fail_unrun(s, take_pinned_locked(s));
    oi_stats_free(s->stats);
    free(s->lists);
    free(s->level_count);
    free(s->policies);
    free(s->pinned);
    free(s->here_slot_busy);
    pthread_cond_destroy(&s->gather_cv);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->ord_cv);
    pthread_mutex_destroy(&s->ord_mu);
    free(s);
}
