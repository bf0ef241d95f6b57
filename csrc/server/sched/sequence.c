#include "server/sched/sequence.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/thread.h"
#include "server/sched/sequence_impl.h"

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

void oi__seq_clear_states(oi_seq_t *q, sequence_t *s)
{
    if (s->have_states)
        for (uint32_t k = 0; k < q->n_states; k++)
            oi_tensor_clear(&s->states[k]);
    s->have_states = 0;
}

void oi__seq_free_sequence(oi_seq_t *q, sequence_t *s)
{
    oi__seq_clear_states(q, s);
    free(s->states);
    free(s->id_str);
    free(s);
}

void oi__seq_free_item(item_t *it)
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
    /* A request dropped here because it or its sequence was cancelled counts as a failure
     * of reason CANCELED, as Triton counts the requests its sequence batcher cancels (every
     * queued one of the sequence); the other refusals here are not counted. */
    oi_stats_t *stats = st != NULL && st->code == OI_CLIENT_CLOSED ? oi_scheduler_stats(it->q->sched) : NULL;
    if (stats != NULL) {
        atomic_store(&outer->cancelled, 1);
        outer->times = (oi_stats_times_t){it->arrived_ns, 0, 0, 0};
        outer->slot = &stats->shared;
    }
    oi__seq_free_item(it);
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
void oi__seq_fail_later(oi_seq_t *q, item_t **failed, item_t *it, oi_status_t *st)
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
sequence_t *oi__seq_release_slot_locked(oi_seq_t *q, sequence_t *s)
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
int oi__seq_over(const sequence_t *s)
{
    return !s->mapped && !s->busy && s->head == NULL;
}

/* Takes the head request off a sequence's queue. */
item_t *oi__seq_pop_head(sequence_t *s)
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
void oi__seq_drop_unrunnable_locked(oi_seq_t *q, sequence_t *s, item_t **failed)
{
    while (s->head != NULL) {
        item_t *it = s->head;
        if (!q->stopping && atomic_load(&it->outer->cancelled)) {
            unmap_locked(q, s);
            oi__seq_fail_later(q, failed, oi__seq_pop_head(s), oi_status_new(OI_CLIENT_CLOSED, "the request was cancelled"));
            while (s->head != NULL)
                oi__seq_fail_later(q, failed, oi__seq_pop_head(s), oi_status_new(OI_CLIENT_CLOSED, "the sequence was cancelled"));
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
        oi__seq_fail_later(q, failed, oi__seq_pop_head(s), st);
    }
}

static void pump_locked(oi_seq_t *q, sequence_t *s, item_t **failed)
{
    if (q->n_instances > 0) { /* Direct: the sequence's instance forms its batches */
        if (s->has_slot)
            oi__seq_dispatch_locked(q, s->slot / q->rows, failed); /* frees the sequence if it is over */
        else if (oi__seq_over(s))
            oi__seq_free_sequence(q, s);
        return;
    }
    while (s->has_slot && !s->busy) {
        oi__seq_drop_unrunnable_locked(q, s, failed);
        if (s->head == NULL)
            break;
        item_t *it = oi__seq_pop_head(s);
        oi_status_t *st = oi__seq_build_request(q, s, it);
        if (st != NULL) {
            oi__seq_fail_later(q, failed, it, st);
            continue;
        }
        s->busy = 1;
        it->in_sched = 1;
        if (oi_scheduler_submit(q->sched, &it->inner) != 0) {
            s->busy = 0;
            it->in_sched = 0;
            oi__seq_fail_later(q, failed, it, oi_status_new(OI_UNAVAILABLE, "the server is shutting down"));
        }
    }
    if (oi__seq_over(s)) {
        sequence_t *b = s->has_slot ? oi__seq_release_slot_locked(q, s) : NULL;
        oi__seq_free_sequence(q, s);
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
        oi__seq_fail_later(q, failed, oi__seq_pop_head(s), oi_status_new(OI_CLIENT_CLOSED, "the sequence was cancelled"));
    if (s->busy)
        return;
    if (!s->has_slot) {
        unlink_backlog(q, s);
        oi__seq_free_sequence(q, s);
        return;
    }
    sequence_t *taker = oi__seq_release_slot_locked(q, s);
    oi__seq_free_sequence(q, s);
    if (taker != NULL)
        pump_locked(q, taker, failed);
}

void oi__seq_finish_failed(item_t *failed)
{
    for (item_t *it = failed, *next; it != NULL; it = next) {
        next = it->next;
        fail_item(it, it->outer->status);
    }
}

/* The scheduler ran (or dropped) an item: on its executor thread. The outer job is completed
 * before the sequence's next request is sent, so that its answers leave in order. */
void oi__seq_item_done(oi_job_t *j)
{
    item_t *it = (item_t *)j;
    sequence_t *s = it->seq; /* stays while busy: nothing releases a busy sequence */
    oi_seq_t *q = it->q;
    oi_job_t *outer = it->outer;
    item_t *failed = NULL;
    pthread_mutex_lock(&q->mu);
    live_remove_locked(q, it);
    oi__seq_take_outputs(q, s, it);
    pthread_mutex_unlock(&q->mu);
    oi__seq_free_item(it);
    outer->done(outer);
    pthread_mutex_lock(&q->mu);
    s->busy = 0;
    s->last_ns = oi_now_ns();
    if (q->n_instances > 0)
        oi__seq_row_done_locked(q, s->slot / q->rows, &failed); /* it holds its slot while busy */
    else
        pump_locked(q, s, &failed);
    pthread_mutex_unlock(&q->mu);
    oi__seq_finish_failed(failed);
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
                oi__seq_free_sequence(q, s);
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
    oi__seq_finish_failed(failed);
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
            oi__seq_fail_later(q, &failed, it, oi_status_new(OI_CLIENT_CLOSED, "the request was cancelled"));
        }
        /* The sequence misses a step now: its state no longer follows its requests, so it
         * ends here rather than run on silently. */
        release_locked(q, s, &failed);
    }
    pthread_mutex_unlock(&q->mu);
    oi__seq_finish_failed(failed);
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
    oi__seq_finish_failed(failed);
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
            sequence_t *taker = oi__seq_release_slot_locked(q, s);
            oi__seq_free_sequence(q, s);
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
                oi__seq_dispatch_locked(q, i, &failed);
        }
        uint64_t next = reap_locked(q, now, &failed);
        if (q->wake_ns != 0 && q->wake_ns < next)
            next = q->wake_ns;
        if (failed != NULL) {
            pthread_mutex_unlock(&q->mu);
            oi__seq_finish_failed(failed);
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
    q->states_follow_outputs = cfg->states_follow_outputs;
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
        oi__seq_fail_later(q, failed, it, oi_status_new(OI_UNAVAILABLE, "the server is shutting down"));
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
    oi__seq_finish_failed(failed);
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
                oi__seq_free_sequence(q, q->slot_seq[k]);
    } else {
        for (size_t b = 0; q->table != NULL && b < q->n_buckets; b++)
            for (sequence_t *s = q->table[b], *next; s != NULL; s = next) {
                next = s->hnext;
                if (s->has_slot) /* else also in the backlog: freed below */
                    oi__seq_free_sequence(q, s);
            }
    }
    for (sequence_t *s = q->backlog_head, *next; s != NULL; s = next) {
        next = s->bnext;
        oi__seq_free_sequence(q, s);
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
