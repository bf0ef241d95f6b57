/* The Direct strategy's batches: each instance's batch formed here from the heads of the
 * sequences holding its rows, padded where one has nothing ready, and handed to that instance.
 * (Oldest needs none of this: its sequences' requests go to the scheduler's dynamic batcher.) */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server/sched/sequence_impl.h"

/* ---- Direct batches ------------------------------------------------------------------------- */

static void pad_done(oi_job_t *j);

/* Undoes build_request for a request that stays queued. */
static void unbuild(item_t *it)
{
    for (uint32_t i = it->n_outer_inputs; i < it->req.n_inputs; i++)
        oi_tensor_clear(&it->req.inputs[i]);
    free(it->req.inputs);
    free(it->out_names);
    it->req.inputs = NULL;
    it->out_names = NULL;
}

/* A padding row for instance `inst`'s batch, shaped as `rep` (a built request of the batch):
 * zeros (empty strings for BYTES), START, END and READY false, CORRID 0, as Triton's null
 * requests. Cancelled from the start: nobody waits for it. NULL when out of memory. */
static item_t *new_pad(oi_seq_t *q, const item_t *rep, int inst)
{
    item_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->q = q;
    p->pad = 1;
    p->inst = inst;
    p->req = rep->req;
    p->req.body = p->req.aux = NULL;
    p->req.id = NULL;
    p->req.id_len = 0;
    p->req.bls_chain = NULL;
    p->req.outputs = NULL;
    p->req.n_outputs = 0;
    p->req.n_inputs = 0;
    p->req.inputs = calloc(rep->req.n_inputs + 1, sizeof(oi_tensor_t));
    p->out_names = calloc(rep->inner.n_outputs + 1, sizeof(char *));
    if (p->req.inputs == NULL || p->out_names == NULL) {
        oi__seq_free_item(p);
        return NULL;
    }
    memcpy(p->out_names, rep->out_names, rep->inner.n_outputs * sizeof(char *));
    for (uint32_t i = 0; i < rep->req.n_inputs; i++) {
        const oi_tensor_t *f = &rep->req.inputs[i];
        oi_tensor_t *t = &p->req.inputs[i];
        int64_t count = 0;
        oi_shape_elements(f->shape, f->ndim, &count);
        size_t size = f->dtype == OI_TYPE_BYTES ? 4 * (size_t)count : f->byte_size;
        if ((t->owner = oi_buf_new(size ? size : 1)) == NULL) {
            oi__seq_free_item(p);
            return NULL;
        }
        p->req.n_inputs = i + 1;
        t->name = f->name;
        t->dtype = f->dtype;
        t->ndim = f->ndim;
        memcpy(t->shape, f->shape, sizeof(t->shape));
        t->data = t->owner->data;
        memset(t->data, 0, size);
        t->byte_size = t->owner->len = size;
        uint32_t k = i - rep->n_outer_inputs; /* the controls follow the request's inputs */
        if (i >= rep->n_outer_inputs && k < q->n_controls && q->controls[k].kind != OI_SEQ_CONTROL_CORRID)
            oi__seq_put_flag(&q->controls[k], 0, t->data); /* CORRID stays 0 (an empty string for BYTES) */
    }
    p->inner.req = &p->req;
    p->inner.output_names = p->out_names;
    p->inner.n_outputs = rep->inner.n_outputs;
    p->inner.done = pad_done;
    atomic_store(&p->inner.cancelled, 1);
    return p;
}

/* Instance `inst` has no batch running: forms its next one from the requests ready at the
 * heads of its slots' sequences, rows 0 up to the last ready one, each in its sequence's row,
 * padding where a sequence has none ready (or one that cannot share this batch: it goes in a
 * later one), and hands it to that instance. Sequences that are over give up their slots here.
 * Caller holds the lock. */
void oi__seq_dispatch_locked(oi_seq_t *q, int inst, item_t **failed)
{
    if (q->rows_out[inst] > 0)
        return;
    sequence_t **slots = &q->slot_seq[inst * q->rows];
again:;
    int ready = 0, last = -1;
    uint64_t oldest = UINT64_MAX;
    for (int r = 0; r < q->rows; r++) {
        sequence_t *s = slots[r];
        if (s == NULL)
            continue;
        oi__seq_drop_unrunnable_locked(q, s, failed);
        if (oi__seq_over(s)) { /* its row may go to a sequence from the backlog: look again */
            oi__seq_release_slot_locked(q, s);
            oi__seq_free_sequence(q, s);
            r--;
            continue;
        }
        if (s->head != NULL) {
            ready++;
            last = r;
            if (s->head->arrived_ns < oldest)
                oldest = s->head->arrived_ns;
        }
    }
    if (last < 0 || q->stopping)
        return;
    if (q->delay_ns > 0 && q->min_util > 0 && (double)ready / q->rows < q->min_util) {
        uint64_t due = oldest + q->delay_ns;
        if (oi_now_ns() < due) { /* the idle thread fires it then, unless it fills up first */
            if (q->wake_ns == 0 || due < q->wake_ns) {
                q->wake_ns = due;
                pthread_cond_signal(&q->reaper_cv);
            }
            return;
        }
    }
    item_t *rep = NULL;
    for (int r = 0; r <= last; r++) {
        sequence_t *s = slots[r];
        item_t *it = s != NULL ? s->head : NULL;
        q->batch[r] = NULL;
        if (it == NULL)
            continue;
        oi_status_t *st = oi__seq_build_request(q, s, it);
        if (st != NULL) { /* out of memory: fail it and start over without it */
            for (int k = 0; k < r; k++)
                if (q->batch[k] != NULL)
                    unbuild(q->batch[k]);
            oi__seq_fail_later(q, failed, oi__seq_pop_head(s), st);
            goto again;
        }
        if (rep != NULL && !oi_jobs_batchable(&rep->inner, &it->inner)) {
            unbuild(it); /* other shapes or outputs than the batch's: a later batch */
            continue;
        }
        if (rep == NULL)
            rep = it;
        q->batch[r] = it;
    }
    oi_job_t *first = NULL, **link = &first;
    for (int r = 0; r <= last; r++) {
        item_t *it = q->batch[r] != NULL ? q->batch[r] : new_pad(q, rep, inst);
        if (it == NULL) { /* out of memory: this batch fails */
            for (oi_job_t *j = first, *next; j != NULL; j = next) {
                next = j->next;
                if (((item_t *)j)->pad)
                    oi__seq_free_item((item_t *)j);
            }
            for (int k = 0; k <= last; k++)
                if (q->batch[k] != NULL)
                    oi__seq_fail_later(q, failed, oi__seq_pop_head(slots[k]), oi_status_new(OI_INTERNAL, "out of memory"));
            goto again;
        }
        *link = &it->inner;
        link = &it->inner.next;
        it->inner.next = NULL;
    }
    for (int r = 0; r <= last; r++)
        if (q->batch[r] != NULL) {
            oi__seq_pop_head(slots[r]);
            slots[r]->busy = 1;
            q->batch[r]->in_sched = 1;
        }
    q->rows_out[inst] = last + 1;
    if (oi_scheduler_submit_pinned(q->sched, first, inst) == 0)
        return;
    q->rows_out[inst] = 0; /* the scheduler is stopping */
    for (oi_job_t *j = first, *next; j != NULL; j = next) {
        next = j->next;
        item_t *it = (item_t *)j;
        if (it->pad) {
            oi__seq_free_item(it);
            continue;
        }
        it->seq->busy = 0;
        it->in_sched = 0;
        oi__seq_fail_later(q, failed, it, oi_status_new(OI_UNAVAILABLE, "the server is shutting down"));
    }
}

/* One row of instance `inst`'s batch is done: after the last, the instance takes its next. */
void oi__seq_row_done_locked(oi_seq_t *q, int inst, item_t **failed)
{
    if (--q->rows_out[inst] == 0)
        oi__seq_dispatch_locked(q, inst, failed);
}

/* A padding row is done: its outputs are dropped. */
static void pad_done(oi_job_t *j)
{
    item_t *p = (item_t *)j, *failed = NULL;
    oi_seq_t *q = p->q;
    pthread_mutex_lock(&q->mu);
    oi__seq_row_done_locked(q, p->inst, &failed);
    pthread_mutex_unlock(&q->mu);
    oi__seq_free_item(p);
    oi__seq_finish_failed(failed);
}
