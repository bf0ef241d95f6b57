#include "server/sched/decoupled.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "server/infer.h"
#include "server/validate.h"

/* Shared by the inference (one reference), and by each credit not yet given back: a written
 * response may outlive its request in the socket's queue. */
struct oi_dstream_s {
    atomic_int refs;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the executor waits here while `unsent` is over the bound */
    size_t unsent;     /* credits of the responses sent and not yet written */
};

static void ds_unref(oi_dstream_t *ds)
{
    if (ds != NULL && atomic_fetch_sub(&ds->refs, 1) == 1) {
        pthread_cond_destroy(&ds->cv);
        pthread_mutex_destroy(&ds->mu);
        free(ds);
    }
}

void oi__dstream_unref(oi_dstream_t *ds)
{
    ds_unref(ds);
}

static void give_back(oi_dstream_t *ds, size_t credit)
{
    pthread_mutex_lock(&ds->mu);
    ds->unsent -= credit < ds->unsent ? credit : ds->unsent;
    pthread_cond_signal(&ds->cv);
    pthread_mutex_unlock(&ds->mu);
}

void oi__dstream_cancel(oi_dstream_t *ds)
{
    if (ds == NULL)
        return;
    /* The job is marked cancelled already; taking the lock orders that before a waiter's
     * check, so the wake-up cannot be lost. */
    pthread_mutex_lock(&ds->mu);
    pthread_cond_broadcast(&ds->cv);
    pthread_mutex_unlock(&ds->mu);
}

/* ---- credits tied to written bytes ----------------------------------------------------------- */

typedef struct credit_s {
    oi_buf_t *inner; /* the slice's own owner (may be NULL) */
    oi_dstream_t *ds;
    size_t credit;
} credit_t;

static void credit_release(oi_buf_t *b)
{
    credit_t *c = b->ctx;
    oi_buf_unref(c->inner);
    give_back(c->ds, c->credit);
    ds_unref(c->ds);
    free(c);
    free(b);
}

void oi_infer_part_hold(oi_infer_part_t *part, oi_iov_t *iov)
{
    oi_dstream_t *ds = part->inf->ds;
    if (part->held || ds == NULL)
        return;
    credit_t *c = malloc(sizeof(*c));
    oi_buf_t *w = c ? oi_buf_wrap((void *)iov->base, iov->len, credit_release, c) : NULL;
    if (w == NULL) { /* out of memory: the credit comes back with the callback */
        free(c);
        return;
    }
    atomic_fetch_add(&ds->refs, 1);
    *c = (credit_t){iov->owner, ds, part->credit};
    iov->owner = w;
    part->held = 1;
}

/* ---- the executor's side ---------------------------------------------------------------------- */

/* On the loop thread, in order with the other parts and before `done`. */
static void run_part(oi_task_t *t)
{
    oi_infer_part_t *p = (oi_infer_part_t *)t;
    oi_infer_t *inf = p->inf;
    if (!inf->cancelled)
        inf->part(inf, p);
    if (!p->held)
        give_back(inf->ds, p->credit);
    oi_response_clear(&p->resp);
    free(p);
}

static int gone(const oi_infer_t *inf)
{
    return atomic_load(&inf->job.cancelled);
}

/* The request's `send`: checks the response, waits while the client is behind, and posts it
 * to the loop. */
static oi_status_t *send_part(void *arg, oi_response_t *resp)
{
    oi_infer_t *inf = arg;
    oi_dstream_t *ds = inf->ds;
    oi_status_t *st = oi_validate_response(inf->model, inf->job.output_names, inf->job.n_outputs, resp);
    if (st == NULL && inf->shm_out != NULL)
        st = oi_shm_place_outputs(resp, inf->shm_out, inf->job.output_names, inf->job.n_outputs);
    oi_infer_part_t *p = st == NULL ? calloc(1, sizeof(*p)) : NULL;
    if (st == NULL && p == NULL)
        st = oi_status_new(OI_INTERNAL, "out of memory");
    if (st != NULL) {
        oi_response_clear(resp);
        return st;
    }
    size_t credit = 256;
    for (uint32_t i = 0; i < resp->n_outputs; i++)
        credit += resp->outputs[i].shm ? 0 : resp->outputs[i].byte_size;
    pthread_mutex_lock(&ds->mu);
    while (!gone(inf) && ds->unsent > 0 && ds->unsent + credit > OI_DSTREAM_LIMIT)
        pthread_cond_wait(&ds->cv, &ds->mu);
    int cancelled = gone(inf);
    if (!cancelled)
        ds->unsent += credit;
    pthread_mutex_unlock(&ds->mu);
    if (cancelled) {
        free(p);
        oi_response_clear(resp);
        return oi_status_new(OI_CLIENT_CLOSED, "the request was cancelled");
    }
    p->inf = inf;
    p->resp = *resp;
    *resp = (oi_response_t){0};
    p->credit = credit;
    p->task.run = run_part;
    oi_loop_post(inf->loop, &p->task);
    return NULL;
}

int oi__dstream_attach(oi_infer_t *inf)
{
    oi_dstream_t *ds = calloc(1, sizeof(*ds));
    if (ds == NULL)
        return -1;
    atomic_init(&ds->refs, 1);
    pthread_mutex_init(&ds->mu, NULL);
    pthread_cond_init(&ds->cv, NULL);
    inf->ds = ds;
    inf->req.send = send_part;
    inf->req.send_arg = inf;
    return 0;
}
