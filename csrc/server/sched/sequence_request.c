/* The sequence batcher's requests as the model sees them: the transport's inputs, then a
 * tensor per control (START, END, READY, CORRID), then the state inputs; and the state outputs
 * kept as the sequence's next state inputs (where the states follow the outputs). */
#include <stdlib.h>
#include <string.h>

#include "server/sched/sequence_impl.h"

/* Writes a flag control's false (on 0) or true value into `p`; returns the bytes written. */
size_t oi__seq_put_flag(const oi_seq_control_t *c, int on, char *p)
{
    double v = c->false_true[on];
    switch (c->dtype) {
    case OI_TYPE_FP32: {
        float x = (float)v;
        memcpy(p, &x, 4);
        return 4;
    }
    case OI_TYPE_BOOL: *p = v != 0; return 1;
    default: { /* INT32 */
        int32_t x = (int32_t)v;
        memcpy(p, &x, 4);
        return 4;
    }
    }
}

/* Writes one control value (the flag's false or true value, or the correlation id) into `p`;
 * returns the bytes written. */
static size_t put_control(const oi_seq_control_t *c, const item_t *it, char *p)
{
    const oi_seq_params_t *sp = &it->outer->req->seq;
    if (c->kind == OI_SEQ_CONTROL_CORRID) {
        if (c->dtype == OI_TYPE_BYTES) {
            uint32_t n = (uint32_t)sp->id_str_len;
            memcpy(p, &n, 4);
            memcpy(p + 4, sp->id_str, n);
            return 4 + (size_t)n;
        }
        uint64_t v = sp->id;
        switch (c->dtype) {
        case OI_TYPE_UINT32: {
            uint32_t x = (uint32_t)v;
            memcpy(p, &x, 4);
            return 4;
        }
        case OI_TYPE_INT32: {
            int32_t x = (int32_t)v;
            memcpy(p, &x, 4);
            return 4;
        }
        default: /* UINT64, INT64 */ memcpy(p, &v, 8); return 8;
        }
    }
    int on = c->kind == OI_SEQ_CONTROL_START ? it->start : c->kind == OI_SEQ_CONTROL_END ? it->end : 1;
    return oi__seq_put_flag(c, on, p);
}

/* Builds the item's request: the outer inputs, then a tensor per control, then the state
 * inputs (the sequence's last state output, or the initial state at START and, where the
 * states do not follow the outputs, always), asking the model for the state outputs where they
 * do. Caller holds the lock (the sequence's state is read). Returns NULL or a status. */
oi_status_t *oi__seq_build_request(oi_seq_t *q, sequence_t *s, item_t *it)
{
    const oi_job_t *outer = it->outer;
    const oi_request_t *r = outer->req;
    uint32_t n = r->n_inputs + q->n_controls + q->n_states;
    it->req = *r;
    if (r->timeout_us != 0) { /* what is left of it after the wait behind the sequence */
        uint64_t waited_us = (oi_now_ns() - it->arrived_ns) / 1000u;
        it->req.timeout_us = r->timeout_us > waited_us ? r->timeout_us - waited_us : 1;
    }
    it->req.inputs = calloc(n, sizeof(oi_tensor_t));
    it->out_names = calloc((size_t)outer->n_outputs + q->n_states + 1, sizeof(char *));
    if (it->req.inputs == NULL || it->out_names == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    memcpy(it->req.inputs, r->inputs, r->n_inputs * sizeof(oi_tensor_t));
    it->req.n_inputs = it->n_outer_inputs = r->n_inputs;
    int batching = q->max_batch_size > 0;
    for (uint32_t k = 0; k < q->n_controls; k++) {
        const oi_seq_control_t *c = &q->controls[k];
        size_t cap = c->dtype == OI_TYPE_BYTES ? 4 + r->seq.id_str_len : 8;
        oi_tensor_t *t = &it->req.inputs[it->req.n_inputs];
        if ((t->owner = oi_buf_new(cap)) == NULL)
            return oi_status_new(OI_INTERNAL, "out of memory");
        it->req.n_inputs++;
        t->name = c->name;
        t->dtype = c->dtype;
        t->ndim = batching ? 2 : 1;
        t->shape[0] = t->shape[1] = 1;
        t->data = t->owner->data;
        t->byte_size = t->owner->len = put_control(c, it, t->data);
    }
    if (it->start)
        oi__seq_clear_states(q, s);
    for (uint32_t k = 0; k < q->n_states; k++) {
        const oi_seq_state_t *st = &q->states[k];
        oi_tensor_t *t = &it->req.inputs[it->req.n_inputs];
        if (s->have_states) {
            *t = s->states[k];
            if (t->owner != NULL)
                oi_buf_ref(t->owner);
        } else {
            t->dtype = st->dtype;
            t->ndim = st->ndim;
            memcpy(t->shape, st->dims, sizeof(t->shape));
            if (st->initial_size > 0) {
                if ((t->owner = oi_buf_new(st->initial_size)) == NULL)
                    return oi_status_new(OI_INTERNAL, "out of memory");
                memcpy(t->owner->data, st->initial, st->initial_size);
                t->data = t->owner->data;
                t->byte_size = t->owner->len = st->initial_size;
            }
        }
        t->name = st->input_name;
        t->parameters = (oi_slice_t){NULL, 0};
        t->shm = 0;
        it->req.n_inputs++;
    }
    uint32_t no = outer->n_outputs;
    memcpy(it->out_names, outer->output_names, no * sizeof(char *));
    for (uint32_t k = 0; q->states_follow_outputs && k < q->n_states; k++) {
        uint32_t i = 0;
        while (i < outer->n_outputs && strcmp(outer->output_names[i], q->states[k].output_name) != 0)
            i++;
        if (i == outer->n_outputs)
            it->out_names[no++] = q->states[k].output_name;
    }
    it->inner.req = &it->req;
    it->inner.output_names = it->out_names;
    it->inner.n_outputs = no;
    it->inner.done = oi__seq_item_done;
    it->inner.counted = outer->counted;
    it->inner.rows = outer->rows;
    return NULL;
}

/* Keeps the state outputs the model produced as the sequence's next state inputs (where the
 * states follow the outputs), and hands the outer job the outputs it asked for. */
void oi__seq_take_outputs(oi_seq_t *q, sequence_t *s, item_t *it)
{
    oi_job_t *outer = it->outer;
    oi_response_t *r = &it->inner.resp;
    int keep = q->states_follow_outputs && q->n_states > 0;
    for (uint32_t k = 0; keep && it->inner.status == NULL && r->n_outputs == it->inner.n_outputs && k < q->n_states;
         k++) {
        uint32_t i = oi_name_index(it->out_names, r->n_outputs, q->states[k].output_name);
        if (i < r->n_outputs && r->outputs[i].absent) /* an output may be left out; the next state may not */
            it->inner.status = oi_status_new(OI_INTERNAL, "the model did not produce state output '%s'",
                                             q->states[k].output_name);
    }
    if (keep && it->inner.status == NULL && r->n_outputs == it->inner.n_outputs) {
        oi__seq_clear_states(q, s);
        for (uint32_t k = 0; k < q->n_states; k++) {
            uint32_t i = oi_name_index(it->out_names, r->n_outputs, q->states[k].output_name);
            s->states[k] = r->outputs[i];
            s->states[k].name = q->states[k].input_name;
            s->states[k].shm = 0;
            if (s->states[k].owner != NULL)
                oi_buf_ref(s->states[k].owner);
        }
        s->have_states = 1;
        for (uint32_t i = outer->n_outputs; i < r->n_outputs; i++)
            oi_tensor_clear(&r->outputs[i]);
        r->n_outputs = outer->n_outputs;
    }
    outer->resp = *r;
    *r = (oi_response_t){0};
    outer->status = it->inner.status;
    it->inner.status = NULL;
    outer->times = it->inner.times;
    outer->times.start = it->arrived_ns;
    outer->slot = it->inner.slot;
}
