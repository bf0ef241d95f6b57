#include "server/sched/sequence.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/thread.h"

typedef struct sequence_s sequence_t;

/* One request of a sequence, from oi_seq_submit until its job's `done`. Owned by the batcher;
 * `inner` is what the scheduler runs: the transport's request plus controls and state. */
typedef struct item_s {
    oi_job_t inner;
    oi_job_t *outer; /* the transport's job; borrowed until its done is called */
    oi_seq_t *q;
    struct item_s *next;
    struct item_s *live_prev, *live_next; /* in q->live from submit until it leaves the batcher */
    sequence_t *seq;
    oi_request_t req;        /* a shallow copy of the outer request with more inputs */
    const char **out_names;  /* the outer job's outputs, then state outputs it did not ask for */
    uint32_t n_outer_inputs; /* inputs past these are the item's own (one reference each) */
    uint64_t arrived_ns;
    uint8_t start, end;
    uint8_t in_sched; /* `inner` is in the scheduler: cancelled there, not here */
    uint8_t pad;      /* Direct: a padding row of instance `inst`'s batch (no outer job, no sequence) */
    int inst;
} item_t;

/* A sequence: one correlation id from its START until its END ran or it was released. */
struct sequence_s {
    sequence_t *hnext;        /* in the id table, while `mapped` */
    sequence_t *bnext, *bprev; /* in the backlog, while waiting for a slot */
    uint64_t id;
    uint64_t session; /* the client session of its last request (oi_seq_params_t.session) */
    char *id_str; /* NULL: numeric id */
    size_t id_str_len;
    uint64_t hash;
    int mapped;   /* requests for its id come here (until its END is queued, or idle release) */
    int has_slot; /* may run; else it waits in the backlog */
    int slot;     /* Direct: the slot it holds (row slot % rows of instance slot / rows) */
    int busy;     /* one of its requests is in the scheduler */
    item_t *head, *tail;
    uint64_t last_ns;    /* when it was last active (a request arrived or ended) */
    oi_tensor_t *states; /* the current state tensors (n_states); none before the first output */
    int have_states;
};

struct oi_seq_s {
    pthread_mutex_t mu;
    pthread_cond_t reaper_cv; /* monotonic clock */
    pthread_t reaper;
    int reaper_started;
    int stopping;
    oi_scheduler_t *sched;
    char *model_name;
    int max_batch_size;
    int free_slots;
    uint64_t idle_ns;
    oi_seq_control_t *controls;
    uint32_t n_controls;
    oi_seq_state_t *states;
    uint32_t n_states;
    int corrid; /* index of the CORRID control, or -1 */
    sequence_t **table;
    size_t n_buckets, n_mapped;
    sequence_t *backlog_head, *backlog_tail;
    uint32_t n_backlog, max_backlog; /* sequences in the backlog, and how many may be (0: any) */
    item_t *live; /* every item not yet completed: what oi_seq_cancel looks a job up in */
    /* Direct strategy (n_instances > 0); Oldest counts free_slots instead. */
    int n_instances;
    int rows;              /* slots per instance: max(1, max_batch_size) */
    sequence_t **slot_seq; /* n_instances x rows: the sequence holding each slot, or NULL */
    int *rows_out;         /* per instance: rows of its batch not yet done (0: it takes the next) */
    item_t **batch;        /* rows: scratch for forming a batch */
    uint64_t delay_ns;     /* max_queue_delay_microseconds, while utilization is below min_util */
    double min_util;
    uint64_t wake_ns; /* a batch waiting for utilization goes then at the latest; 0: none waits */
};

/* ---- id table ------------------------------------------------------------------------------ */

static uint64_t hash_id(uint64_t id, const char *s, size_t n)
{
    uint64_t h;
    if (s == NULL) {
        h = id + 0x9e3779b97f4a7c15u;
        h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9u;
        h = (h ^ (h >> 27)) * 0x94d049bb133111ebu;
        return h ^ (h >> 31);
    }
    h = 1469598103934665603u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211u;
    return h;
}

static int same_id(const sequence_t *s, uint64_t id, const char *str, size_t n)
{
    if (str == NULL)
        return s->id_str == NULL && s->id == id;
    return s->id_str != NULL && s->id_str_len == n && memcmp(s->id_str, str, n) == 0;
}

static sequence_t *find_locked(oi_seq_t *q, uint64_t h, uint64_t id, const char *str, size_t n)
{
    for (sequence_t *s = q->table[h & (q->n_buckets - 1)]; s != NULL; s = s->hnext)
        if (s->hash == h && same_id(s, id, str, n))
            return s;
    return NULL;
}

static void unmap_locked(oi_seq_t *q, sequence_t *s)
{
    if (!s->mapped)
        return;
    for (sequence_t **p = &q->table[s->hash & (q->n_buckets - 1)]; *p != NULL; p = &(*p)->hnext)
        if (*p == s) {
            *p = s->hnext;
            break;
        }
    s->hnext = NULL;
    s->mapped = 0;
    q->n_mapped--;
}

/* Doubles the table when it is full; a failed allocation only leaves the chains longer. */
static void map_locked(oi_seq_t *q, sequence_t *s)
{
    if (q->n_mapped >= q->n_buckets) {
        size_t n = q->n_buckets * 2;
        sequence_t **t = calloc(n, sizeof(*t));
        if (t != NULL) {
            for (size_t b = 0; b < q->n_buckets; b++)
                for (sequence_t *x = q->table[b], *next; x != NULL; x = next) {
                    next = x->hnext;
                    x->hnext = t[x->hash & (n - 1)];
                    t[x->hash & (n - 1)] = x;
                }
            free(q->table);
            q->table = t;
            q->n_buckets = n;
        }
    }
    sequence_t **b = &q->table[s->hash & (q->n_buckets - 1)];
    s->hnext = *b;
    *b = s;
    s->mapped = 1;
    q->n_mapped++;
}

/* ---- sequences ------------------------------------------------------------------------------ */

static void clear_states(oi_seq_t *q, sequence_t *s)
{
    if (s->have_states)
        for (uint32_t k = 0; k < q->n_states; k++)
            oi_tensor_clear(&s->states[k]);
    s->have_states = 0;
}

static void free_sequence(oi_seq_t *q, sequence_t *s)
{
    clear_states(q, s);
    free(s->states);
    free(s->id_str);
    free(s);
}

static void free_item(item_t *it)
{
    for (uint32_t i = it->n_outer_inputs; i < it->req.n_inputs; i++)
        oi_tensor_clear(&it->req.inputs[i]);
    free(it->req.inputs);
    free(it->out_names);
    oi_response_clear(&it->inner.resp);
    oi_status_free(it->inner.status);
    free(it);
}

/* Completes an item that never ran (its outer job gets `st`) and frees it. Outside the lock. */
static void fail_item(item_t *it, oi_status_t *st)
{
    oi_job_t *outer = it->outer;
    outer->status = st;
    outer->slot = NULL;
    free_item(it);
    outer->done(outer);
}

static void append_backlog(oi_seq_t *q, sequence_t *s)
{
    s->bnext = NULL;
    s->bprev = q->backlog_tail;
    if (q->backlog_tail)
        q->backlog_tail->bnext = s;
    else
        q->backlog_head = s;
    q->backlog_tail = s;
    q->n_backlog++;
}

/* Takes a sequence out of the backlog. Caller holds the lock. */
static void unlink_backlog(oi_seq_t *q, sequence_t *s)
{
    if (s->bprev != NULL)
        s->bprev->bnext = s->bnext;
    else
        q->backlog_head = s->bnext;
    if (s->bnext != NULL)
        s->bnext->bprev = s->bprev;
    else
        q->backlog_tail = s->bprev;
    s->bnext = s->bprev = NULL;
    q->n_backlog--;
}

/* ---- dispatch ------------------------------------------------------------------------------- */

static void item_done(oi_job_t *j);

/* Writes a flag control's false (on 0) or true value into `p`; returns the bytes written. */
static size_t put_flag(const oi_seq_control_t *c, int on, char *p)
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
    return put_flag(c, on, p);
}

/* Builds the item's request: the outer inputs, then a tensor per control, then the state
 * inputs (the sequence's last state output, or the initial state at START). Caller holds the
 * lock (the sequence's state is read). Returns NULL or a status. */
static oi_status_t *build_request(oi_seq_t *q, sequence_t *s, item_t *it)
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
        clear_states(q, s);
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
    for (uint32_t k = 0; k < q->n_states; k++) {
        uint32_t i = 0;
        while (i < outer->n_outputs && strcmp(outer->output_names[i], q->states[k].output_name) != 0)
            i++;
        if (i == outer->n_outputs)
            it->out_names[no++] = q->states[k].output_name;
    }
    it->inner.req = &it->req;
    it->inner.output_names = it->out_names;
    it->inner.n_outputs = no;
    it->inner.done = item_done;
    it->inner.counted = outer->counted;
    it->inner.rows = outer->rows;
    return NULL;
}

/* Sends the sequence's next request to the scheduler while it has a slot and none running;
 * requests that cannot run go to `failed` (with their status in outer->status) for the caller
 * to complete outside the lock. Then releases the sequence if it is over: its END ran (it is
 * no longer mapped) or it was released, and nothing is left. Caller holds the lock. */
static void pump_locked(oi_seq_t *q, sequence_t *s, item_t **failed);

static void live_add_locked(oi_seq_t *q, item_t *it)
{
    it->live_prev = NULL;
    it->live_next = q->live;
    if (q->live != NULL)
        q->live->live_prev = it;
    q->live = it;
}

static void live_remove_locked(oi_seq_t *q, item_t *it)
{
    if (it->live_prev != NULL)
        it->live_prev->live_next = it->live_next;
    else if (q->live == it)
        q->live = it->live_next;
    if (it->live_next != NULL)
        it->live_next->live_prev = it->live_prev;
    it->live_prev = it->live_next = NULL;
}

/* Caller holds the lock: the item leaves the batcher (its sequence's queue and q->live). */
static void fail_later(oi_seq_t *q, item_t **failed, item_t *it, oi_status_t *st)
{
    live_remove_locked(q, it);
    it->outer->status = st;
    it->next = *failed;
    *failed = it;
}

/* Gives a sequence a slot if one is free: Direct fills row 0 of every instance before row 1
 * of any, as Triton does, spreading sequences over the instances. Caller holds the lock. */
static int take_slot_locked(oi_seq_t *q, sequence_t *s)
{
    if (q->n_instances == 0) {
        if (q->free_slots == 0)
            return 0;
        q->free_slots--;
        s->has_slot = 1;
        return 1;
    }
    for (int r = 0; r < q->rows; r++)
        for (int i = 0; i < q->n_instances; i++) {
            int k = i * q->rows + r;
            if (q->slot_seq[k] == NULL) {
                q->slot_seq[k] = s;
                s->slot = k;
                s->has_slot = 1;
                return 1;
            }
        }
    return 0;
}

/* The sequence gives up its slot (it is over), to the first sequence of the backlog if any:
 * returned, for the caller to pump. Caller holds the lock. */
static sequence_t *release_slot_locked(oi_seq_t *q, sequence_t *s)
{
    s->has_slot = 0;
    sequence_t *b = q->backlog_head;
    if (b != NULL) {
        unlink_backlog(q, b);
        b->has_slot = 1;
        b->slot = s->slot;
    }
    if (q->n_instances > 0)
        q->slot_seq[s->slot] = b;
    else if (b == NULL)
        q->free_slots++;
    return b;
}

/* A sequence is over once its END was queued (or it was released) and nothing is left. */
static int over(const sequence_t *s)
{
    return !s->mapped && !s->busy && s->head == NULL;
}

/* Takes the head request off a sequence's queue. */
static item_t *pop_head(sequence_t *s)
{
    item_t *it = s->head;
    s->head = it->next;
    if (s->head == NULL)
        s->tail = NULL;
    it->next = NULL;
    return it;
}

/* Fails the requests at the head of the sequence that must not run: the server is stopping,
 * or they waited past their timeout. One whose client has gone (before oi_seq_cancel came)
 * ends the sequence as oi_seq_cancel would (see release_locked): it and those behind it are
 * failed, and the caller finds the sequence over once nothing of it runs. */
static void drop_unrunnable_locked(oi_seq_t *q, sequence_t *s, item_t **failed)
{
    while (s->head != NULL) {
        item_t *it = s->head;
        if (!q->stopping && atomic_load(&it->outer->cancelled)) {
            unmap_locked(q, s);
            fail_later(q, failed, pop_head(s), oi_status_new(OI_CLIENT_CLOSED, "the request was cancelled"));
            while (s->head != NULL)
                fail_later(q, failed, pop_head(s), oi_status_new(OI_CLIENT_CLOSED, "the sequence was cancelled"));
            return;
        }
        oi_status_t *st = NULL;
        /* Triton's "timeout" bounds the whole wait, behind the sequence's earlier requests too. */
        uint64_t timeout_us = it->outer->req->timeout_us;
        if (q->stopping)
            st = oi_status_new(OI_UNAVAILABLE, "the server is shutting down");
        else if (timeout_us != 0 && timeout_us < UINT64_MAX / 1000u && oi_now_ns() - it->arrived_ns >= timeout_us * 1000u)
            st = oi_status_new(OI_UNAVAILABLE, "Request timeout expired");
        if (st == NULL)
            return;
        fail_later(q, failed, pop_head(s), st);
    }
}

static void dispatch_locked(oi_seq_t *q, int inst, item_t **failed);

static void pump_locked(oi_seq_t *q, sequence_t *s, item_t **failed)
{
    if (q->n_instances > 0) { /* Direct: the sequence's instance forms its batches */
        if (s->has_slot)
            dispatch_locked(q, s->slot / q->rows, failed); /* frees the sequence if it is over */
        else if (over(s))
            free_sequence(q, s);
        return;
    }
    while (s->has_slot && !s->busy) {
        drop_unrunnable_locked(q, s, failed);
        if (s->head == NULL)
            break;
        item_t *it = pop_head(s);
        oi_status_t *st = build_request(q, s, it);
        if (st != NULL) {
            fail_later(q, failed, it, st);
            continue;
        }
        s->busy = 1;
        it->in_sched = 1;
        if (oi_scheduler_submit(q->sched, &it->inner) != 0) {
            s->busy = 0;
            it->in_sched = 0;
            fail_later(q, failed, it, oi_status_new(OI_UNAVAILABLE, "the server is shutting down"));
        }
    }
    if (over(s)) {
        sequence_t *b = s->has_slot ? release_slot_locked(q, s) : NULL;
        free_sequence(q, s);
        if (b != NULL)
            pump_locked(q, b, failed);
    }
}

/* The sequence's client has gone: it is over now, as if it had been idle past idle_ns, and as
 * Triton ends a sequence one of whose requests was cancelled. Its id is forgotten (a later
 * request without START is refused) and the requests it has waiting are dropped (499); its
 * slot goes to the backlog now, or once the request of it that runs has completed (which
 * finds the sequence over; that request is cancelled only by its own client). Caller holds
 * the lock. */
static void release_locked(oi_seq_t *q, sequence_t *s, item_t **failed)
{
    unmap_locked(q, s);
    while (s->head != NULL)
        fail_later(q, failed, pop_head(s), oi_status_new(OI_CLIENT_CLOSED, "the sequence was cancelled"));
    if (s->busy)
        return;
    if (!s->has_slot) {
        unlink_backlog(q, s);
        free_sequence(q, s);
        return;
    }
    sequence_t *taker = release_slot_locked(q, s);
    free_sequence(q, s);
    if (taker != NULL)
        pump_locked(q, taker, failed);
}

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
    p->req.outputs = NULL;
    p->req.n_outputs = 0;
    p->req.n_inputs = 0;
    p->req.inputs = calloc(rep->req.n_inputs + 1, sizeof(oi_tensor_t));
    p->out_names = calloc(rep->inner.n_outputs + 1, sizeof(char *));
    if (p->req.inputs == NULL || p->out_names == NULL) {
        free_item(p);
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
            free_item(p);
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
            put_flag(&q->controls[k], 0, t->data); /* CORRID stays 0 (an empty string for BYTES) */
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
static void dispatch_locked(oi_seq_t *q, int inst, item_t **failed)
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
        drop_unrunnable_locked(q, s, failed);
        if (over(s)) { /* its row may go to a sequence from the backlog: look again */
            release_slot_locked(q, s);
            free_sequence(q, s);
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
        oi_status_t *st = build_request(q, s, it);
        if (st != NULL) { /* out of memory: fail it and start over without it */
            for (int k = 0; k < r; k++)
                if (q->batch[k] != NULL)
                    unbuild(q->batch[k]);
            fail_later(q, failed, pop_head(s), st);
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
                    free_item((item_t *)j);
            }
            for (int k = 0; k <= last; k++)
                if (q->batch[k] != NULL)
                    fail_later(q, failed, pop_head(slots[k]), oi_status_new(OI_INTERNAL, "out of memory"));
            goto again;
        }
        *link = &it->inner;
        link = &it->inner.next;
        it->inner.next = NULL;
    }
    for (int r = 0; r <= last; r++)
        if (q->batch[r] != NULL) {
            pop_head(slots[r]);
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
            free_item(it);
            continue;
        }
        it->seq->busy = 0;
        it->in_sched = 0;
        fail_later(q, failed, it, oi_status_new(OI_UNAVAILABLE, "the server is shutting down"));
    }
}

/* One row of instance `inst`'s batch is done: after the last, the instance takes its next. */
static void row_done_locked(oi_seq_t *q, int inst, item_t **failed)
{
    if (--q->rows_out[inst] == 0)
        dispatch_locked(q, inst, failed);
}

static void finish_failed(item_t *failed)
{
    for (item_t *it = failed, *next; it != NULL; it = next) {
        next = it->next;
        fail_item(it, it->outer->status);
    }
}

/* Keeps the state outputs the model produced as the sequence's next state inputs, and hands
 * the outer job the outputs it asked for. */
static void take_outputs(oi_seq_t *q, sequence_t *s, item_t *it)
{
    oi_job_t *outer = it->outer;
    oi_response_t *r = &it->inner.resp;
    if (it->inner.status == NULL && r->n_outputs == it->inner.n_outputs) {
        clear_states(q, s);
        for (uint32_t k = 0; k < q->n_states; k++) {
            uint32_t i = 0;
            while (i < r->n_outputs && strcmp(it->out_names[i], q->states[k].output_name) != 0)
                i++;
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

/* The scheduler ran (or dropped) an item: on its executor thread. The outer job is completed
 * before the sequence's next request is sent, so that its answers leave in order. */
static void item_done(oi_job_t *j)
{
    item_t *it = (item_t *)j;
    sequence_t *s = it->seq; /* stays while busy: nothing releases a busy sequence */
    oi_seq_t *q = it->q;
    oi_job_t *outer = it->outer;
    item_t *failed = NULL;
    pthread_mutex_lock(&q->mu);
    live_remove_locked(q, it);
    take_outputs(q, s, it);
    pthread_mutex_unlock(&q->mu);
    free_item(it);
    outer->done(outer);
    pthread_mutex_lock(&q->mu);
    s->busy = 0;
    s->last_ns = oi_now_ns();
    if (q->n_instances > 0)
        row_done_locked(q, s->slot / q->rows, &failed); /* it holds its slot while busy */
    else
        pump_locked(q, s, &failed);
    pthread_mutex_unlock(&q->mu);
    finish_failed(failed);
}

/* A padding row is done: its outputs are dropped. */
static void pad_done(oi_job_t *j)
{
    item_t *p = (item_t *)j, *failed = NULL;
    oi_seq_t *q = p->q;
    pthread_mutex_lock(&q->mu);
    row_done_locked(q, p->inst, &failed);
    pthread_mutex_unlock(&q->mu);
    free_item(p);
    finish_failed(failed);
}

/* ---- submit --------------------------------------------------------------------------------- */

/* Triton prefixes some request errors with the request's id. */
static const char *log_request(const oi_request_t *r, char *buf, size_t cap)
{
    if (r->id == NULL || r->id_len == 0)
        return "";
    snprintf(buf, cap, "[request id: %.*s] ", (int)(r->id_len < 256 ? r->id_len : 256), r->id);
    return buf;
}

oi_status_t *oi_seq_submit(oi_seq_t *q, oi_job_t *job)
{
    const oi_request_t *r = job->req;
    const oi_seq_params_t *sp = &r->seq;
    int is_str = sp->id_str != NULL;
    if (q->corrid >= 0) {
        oi_dtype_t want = q->controls[q->corrid].dtype;
        if (is_str != (want == OI_TYPE_BYTES)) {
            char buf[300];
            return oi_status_new(OI_BAD_REQUEST,
                                 "%ssequence batching control '%s' data-type is '%s', but model '%s' expects '%s'",
                                 log_request(r, buf, sizeof(buf)), q->controls[q->corrid].name,
                                 is_str ? "BYTES" : "UINT64", q->model_name, oi_dtype_name(want));
        }
    }
    if (q->max_batch_size > 0 && r->n_inputs > 0 && r->inputs[0].ndim > 0 && r->inputs[0].shape[0] > 1)
        return oi_status_new(OI_BAD_REQUEST,
                             "inference request to model '%s' must specify batch-size 1 due to requirements of "
                             "sequence batcher",
                             q->model_name);
    if (is_str ? sp->id_str_len == 0 : sp->id == 0)
        return oi_status_new(OI_BAD_REQUEST,
                             "inference request to model '%s' must specify a non-zero or non-empty correlation ID",
                             q->model_name);
    item_t *it = calloc(1, sizeof(*it));
    if (it == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    it->outer = job;
    it->q = q;
    it->start = sp->start;
    it->end = sp->end;
    it->arrived_ns = oi_now_ns();
    job->status = NULL;
    job->slot = NULL;
    job->enqueued_ns = it->arrived_ns;
    atomic_store(&job->cancelled, 0);
    uint64_t h = hash_id(sp->id, sp->id_str, sp->id_str_len);
    item_t *failed = NULL;
    oi_status_t *st = NULL;
    pthread_mutex_lock(&q->mu);
    sequence_t *s = find_locked(q, h, sp->id, sp->id_str, sp->id_str_len);
    if (q->stopping && (sp->start || s == NULL)) {
        st = oi_status_new(OI_UNAVAILABLE,
                           "Server is stopping, scheduler for model has stopped accepting new inference requests");
    } else if (s == NULL && !sp->start) {
        if (is_str)
            st = oi_status_new(OI_BAD_REQUEST,
                               "inference request for sequence %.*s to model '%s' must specify the START flag on "
                               "the first request of the sequence",
                               (int)(sp->id_str_len < 256 ? sp->id_str_len : 256), sp->id_str, q->model_name);
        else
            st = oi_status_new(OI_BAD_REQUEST,
                               "inference request for sequence %" PRIu64 " to model '%s' must specify the START "
                               "flag on the first request of the sequence",
                               sp->id, q->model_name);
    } else if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s != NULL && q->n_states > 0 && (s->states = calloc(q->n_states, sizeof(oi_tensor_t))) == NULL) {
            free(s);
            s = NULL;
        }
        if (s != NULL && is_str && (s->id_str = malloc(sp->id_str_len + 1)) == NULL) {
            free(s->states);
            free(s);
            s = NULL;
        }
        if (s == NULL) {
            st = oi_status_new(OI_INTERNAL, "out of memory");
        } else {
            s->id = sp->id;
            if (is_str) {
                memcpy(s->id_str, sp->id_str, sp->id_str_len);
                s->id_str[sp->id_str_len] = '\0';
                s->id_str_len = sp->id_str_len;
            }
            s->hash = h;
            if (take_slot_locked(q, s) || q->max_backlog == 0 || q->n_backlog < q->max_backlog) {
                map_locked(q, s);
                if (!s->has_slot)
                    append_backlog(q, s);
            } else { /* 503 as Triton's full queue: the client may try again later */
                st = oi_status_new(OI_UNAVAILABLE,
                                   "sequence backlog full: %" PRIu32 " sequences already wait for a sequence slot "
                                   "of model '%s', the most --max-sequence-backlog allows",
                                   q->n_backlog, q->model_name);
                free_sequence(q, s);
                s = NULL;
            }
        }
    }
    /* A START for a sequence already running continues in its slot, as Triton does: the
     * model sees START and the state starts again. */
    if (st == NULL) {
        it->seq = s;
        s->session = sp->session;
        live_add_locked(q, it);
        if (s->tail)
            s->tail->next = it;
        else
            s->head = it;
        s->tail = it;
        s->last_ns = it->arrived_ns;
        if (sp->end) /* the id is free for a new sequence from now on */
            unmap_locked(q, s);
        pump_locked(q, s, &failed);
    }
    pthread_mutex_unlock(&q->mu);
    if (st != NULL) {
        free(it);
        return st;
    }
    finish_failed(failed);
    return NULL;
}

void oi_seq_cancel(oi_seq_t *q, oi_job_t *job)
{
    if (q == NULL)
        return;
    item_t *failed = NULL;
    pthread_mutex_lock(&q->mu);
    item_t *it = q->live;
    while (it != NULL && it->outer != job)
        it = it->live_next;
    if (it != NULL) {
        sequence_t *s = it->seq;
        if (it->in_sched) {
            oi_job_cancel(&it->inner); /* the scheduler drops it if it has not started */
        } else { /* waiting behind its sequence's earlier requests, or in the backlog: out now */
            item_t **p = &s->head, *prev = NULL;
            while (*p != it) {
                prev = *p;
                p = &(*p)->next;
            }
            *p = it->next;
            if (s->tail == it)
                s->tail = prev;
            it->next = NULL;
            fail_later(q, &failed, it, oi_status_new(OI_CLIENT_CLOSED, "the request was cancelled"));
        }
        /* The sequence misses a step now: its state no longer follows its requests, so it
         * ends here rather than run on silently. */
        release_locked(q, s, &failed);
    }
    pthread_mutex_unlock(&q->mu);
    finish_failed(failed);
}

void oi_seq_release_session(oi_seq_t *q, uint64_t session)
{
    if (q == NULL || session == 0)
        return;
    item_t *failed = NULL;
    pthread_mutex_lock(&q->mu);
    for (size_t b = 0; b < q->n_buckets; b++) {
    again:
        for (sequence_t *s = q->table[b]; s != NULL; s = s->hnext)
            if (s->session == session) {
                release_locked(q, s, &failed);
                goto again; /* the slot's taker may have ended too, and left any chain */
            }
    }
    pthread_mutex_unlock(&q->mu);
    finish_failed(failed);
}

/* ---- idle release --------------------------------------------------------------------------- */

/* Releases the sequences idle past idle_ns (with a slot, nothing queued or running) and
 * returns when the next one may become due. Caller holds the lock. */
static uint64_t reap_locked(oi_seq_t *q, uint64_t now, item_t **failed)
{
    uint64_t next = now + q->idle_ns;
    for (size_t b = 0; b < q->n_buckets; b++) {
    again:
        for (sequence_t *s = q->table[b]; s != NULL; s = s->hnext) {
            uint64_t due = s->last_ns + q->idle_ns;
            if (!s->has_slot || s->busy || s->head != NULL || due > now) {
                if (s->has_slot && !s->busy && s->head == NULL && due < next)
                    next = due;
                continue;
            }
            unmap_locked(q, s);
            sequence_t *taker = release_slot_locked(q, s);
            free_sequence(q, s);
            if (taker != NULL)
                pump_locked(q, taker, failed);
            goto again; /* the taker may have ended (a cancelled request) and left any chain */
        }
    }
    return next;
}

static void *reaper(void *arg)
{
    oi_seq_t *q = arg;
    pthread_mutex_lock(&q->mu);
    while (!q->stopping) {
        item_t *failed = NULL;
        uint64_t now = oi_now_ns();
        if (q->wake_ns != 0 && q->wake_ns <= now) { /* a Direct batch waited long enough */
            q->wake_ns = 0;
            for (int i = 0; i < q->n_instances; i++)
                dispatch_locked(q, i, &failed);
        }
        uint64_t next = reap_locked(q, now, &failed);
        if (q->wake_ns != 0 && q->wake_ns < next)
            next = q->wake_ns;
        if (failed != NULL) {
            pthread_mutex_unlock(&q->mu);
            finish_failed(failed);
            pthread_mutex_lock(&q->mu);
            continue;
        }
        struct timespec ts = {(time_t)(next / 1000000000u), (long)(next % 1000000000u)};
        pthread_cond_timedwait(&q->reaper_cv, &q->mu, &ts);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

/* ---- life cycle ----------------------------------------------------------------------------- */

oi_seq_t *oi_seq_new(const oi_seq_config_t *cfg, oi_scheduler_t *sched, char *err, size_t errlen)
{
    oi_seq_t *q = calloc(1, sizeof(*q));
    if (q == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&q->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&q->reaper_cv, &attr);
    pthread_condattr_destroy(&attr);
    q->sched = sched;
    q->max_batch_size = cfg->max_batch_size;
    q->free_slots = cfg->slots > 0 ? cfg->slots : 1;
    q->max_backlog = cfg->max_backlog;
    if (cfg->direct.instances > 0) {
        q->n_instances = cfg->direct.instances;
        q->rows = cfg->max_batch_size > 0 ? cfg->max_batch_size : 1;
        q->delay_ns = cfg->direct.max_queue_delay_us * 1000u;
        q->min_util = cfg->direct.min_slot_utilization;
        q->slot_seq = calloc((size_t)q->n_instances * (size_t)q->rows, sizeof(*q->slot_seq));
        q->rows_out = calloc((size_t)q->n_instances, sizeof(*q->rows_out));
        q->batch = calloc((size_t)q->rows, sizeof(*q->batch));
    }
    q->idle_ns = (cfg->idle_us > 0 ? cfg->idle_us : 1000000u) * 1000u;
    q->corrid = -1;
    q->n_buckets = 64;
    q->table = calloc(q->n_buckets, sizeof(*q->table));
    q->model_name = strdup(cfg->model_name);
    q->controls = calloc(cfg->n_controls + 1, sizeof(*q->controls));
    q->states = calloc(cfg->n_states + 1, sizeof(*q->states));
    int ok = q->table != NULL && q->model_name != NULL && q->controls != NULL && q->states != NULL &&
             (q->n_instances == 0 || (q->slot_seq != NULL && q->rows_out != NULL && q->batch != NULL));
    for (uint32_t i = 0; ok && i < cfg->n_controls; i++) {
        q->controls[i] = cfg->controls[i];
        ok = (q->controls[i].name = strdup(cfg->controls[i].name)) != NULL;
        q->n_controls = i + 1;
        if (cfg->controls[i].kind == OI_SEQ_CONTROL_CORRID)
            q->corrid = (int)i;
    }
    for (uint32_t i = 0; ok && i < cfg->n_states; i++) {
        oi_seq_state_t *st = &q->states[i];
        *st = cfg->states[i];
        st->input_name = strdup(cfg->states[i].input_name);
        st->output_name = strdup(cfg->states[i].output_name);
        void *init = malloc(st->initial_size ? st->initial_size : 1);
        if (init != NULL && st->initial_size)
            memcpy(init, cfg->states[i].initial, st->initial_size);
        st->initial = init;
        q->n_states = i + 1;
        ok = st->input_name != NULL && st->output_name != NULL && init != NULL;
    }
    if (!ok) {
        snprintf(err, errlen, "out of memory");
        oi_seq_free(q);
        return NULL;
    }
    int rc = oi_thread_create(&q->reaper, "oi-seq-timeout", reaper, q, 0);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the sequence batcher's thread: %s", strerror(rc));
        oi_seq_free(q);
        return NULL;
    }
    q->reaper_started = 1;
    return q;
}

static void drain_locked(oi_seq_t *q, sequence_t *s, item_t **failed)
{
    while (s->head != NULL) {
        item_t *it = s->head;
        s->head = it->next;
        fail_later(q, failed, it, oi_status_new(OI_UNAVAILABLE, "the server is shutting down"));
    }
    s->tail = NULL;
}

void oi_seq_stop(oi_seq_t *q)
{
    if (q == NULL)
        return;
    item_t *failed = NULL;
    pthread_mutex_lock(&q->mu);
    q->stopping = 1;
    /* A sequence with a slot and requests waiting has one running, whose completion fails the
     * rest; those in the backlog (mapped or not) have none. */
    for (sequence_t *s = q->backlog_head; s != NULL; s = s->bnext)
        drain_locked(q, s, &failed);
    for (size_t b = 0; q->table != NULL && b < q->n_buckets; b++)
        for (sequence_t *s = q->table[b]; s != NULL; s = s->hnext)
            if (!s->busy)
                drain_locked(q, s, &failed);
    /* Direct: those whose END is queued behind their instance's batch are no longer mapped. */
    for (int k = 0; q->slot_seq != NULL && k < q->n_instances * q->rows; k++)
        if (q->slot_seq[k] != NULL && !q->slot_seq[k]->busy)
            drain_locked(q, q->slot_seq[k], &failed);
    pthread_cond_broadcast(&q->reaper_cv);
    pthread_mutex_unlock(&q->mu);
    finish_failed(failed);
}

void oi_seq_free(oi_seq_t *q)
{
    if (q == NULL)
        return;
    oi_seq_stop(q);
    if (q->reaper_started)
        pthread_join(q->reaper, NULL);
    /* Every request has completed: what is left are sequences and their states, each holding
     * a slot or in the backlog. */
    if (q->slot_seq != NULL) {
        for (int k = 0; k < q->n_instances * q->rows; k++)
            if (q->slot_seq[k] != NULL)
                free_sequence(q, q->slot_seq[k]);
    } else {
        for (size_t b = 0; q->table != NULL && b < q->n_buckets; b++)
            for (sequence_t *s = q->table[b], *next; s != NULL; s = next) {
                next = s->hnext;
                if (s->has_slot) /* else also in the backlog: freed below */
                    free_sequence(q, s);
            }
    }
    for (sequence_t *s = q->backlog_head, *next; s != NULL; s = next) {
        next = s->bnext;
        free_sequence(q, s);
    }
    for (uint32_t i = 0; i < q->n_controls; i++)
        free((char *)q->controls[i].name);
    for (uint32_t i = 0; i < q->n_states; i++) {
        free((char *)q->states[i].input_name);
        free((char *)q->states[i].output_name);
        free((void *)q->states[i].initial);
    }
    free(q->controls);
    free(q->states);
    free(q->slot_seq);
    free(q->rows_out);
    free(q->batch);
    free(q->table);
    free(q->model_name);
    pthread_cond_destroy(&q->reaper_cv);
    pthread_mutex_destroy(&q->mu);
    free(q);
}
