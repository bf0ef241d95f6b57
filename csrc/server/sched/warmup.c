#include "server/sched/warmup.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/validate.h"

/* The requests of one oi_warmup_run call: the caller waits on `cv` until `left` is 0. */
typedef struct run_s {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t left;
    oi_model_t *model;
} run_t;

typedef struct warm_job_s {
    oi_job_t job; /* first: the scheduler hands back &job */
    run_t *run;
    const char **names;
} warm_job_t;

/* On the executor thread: the outputs are checked as a real response's are. */
static void warm_done(oi_job_t *j)
{
    warm_job_t *w = (warm_job_t *)j;
    if (j->status == NULL)
        j->status = oi_validate_response(w->run->model, j->output_names, j->n_outputs, &j->resp);
    oi_response_clear(&j->resp);
    pthread_mutex_lock(&w->run->mu);
    w->run->left--;
    pthread_cond_signal(&w->run->cv);
    pthread_mutex_unlock(&w->run->mu);
}

/* Appends "; " and `msg` to the joined message (NULL: none yet). */
static char *join(char *acc, const char *msg)
{
    size_t a = acc ? strlen(acc) : 0, b = strlen(msg);
    char *out = realloc(acc, a + b + 3);
    if (out == NULL)
        return acc;
    if (a) {
        memcpy(out + a, "; ", 2);
        a += 2;
    }
    memcpy(out + a, msg, b + 1);
    return out;
}

oi_status_t *oi_warmup_run(oi_model_t *m, oi_request_t *reqs, size_t n)
{
    if (m->seq != NULL) /* its requests need a sequence's controls, which warm-up does not give */
        return oi_status_new(OI_BAD_REQUEST, "warm-up of a sequence model is not supported");
    if (m->decoupled) /* its responses go to a stream, which warm-up does not open */
        return oi_status_new(OI_BAD_REQUEST, "warm-up of a decoupled model is not supported");
    warm_job_t *jobs = calloc(n ? n : 1, sizeof(*jobs));
    if (jobs == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory");
    run_t run = {.left = 0, .model = m};
    pthread_mutex_init(&run.mu, NULL);
    pthread_cond_init(&run.cv, NULL);
    char *errors = NULL;
    /* Each request is checked as a transport's would be, then all are queued together, so
     * that a dynamic batcher may run them as one batch, as Triton runs a sample's requests. */
    for (size_t i = 0; i < n; i++) {
        warm_job_t *w = &jobs[i];
        oi_status_t *st = NULL;
        uint32_t *classes = NULL; /* warm-up asks for no output, so for no classification */
        for (uint32_t k = 0; k < reqs[i].n_inputs && st == NULL; k++)
            st = oi_tensor_check_size(&reqs[i].inputs[k], "input", reqs[i].inputs[k].name);
        if (st == NULL)
            st = oi_validate_request(m, &reqs[i], &w->names, &w->job.n_outputs, &classes);
        free(classes);
        if (st != NULL) {
            errors = join(errors, st->message);
            oi_status_free(st);
            continue;
        }
        w->run = &run;
        w->job.req = &reqs[i];
        w->job.output_names = w->names;
        w->job.done = warm_done;
        w->job.counted = 0; /* the statistics count clients' requests */
        reqs[i].cancelled = oi_job_cancelled;
        reqs[i].cancelled_arg = &w->job;
        pthread_mutex_lock(&run.mu);
        run.left++;
        pthread_mutex_unlock(&run.mu);
        if (oi_scheduler_submit(m->sched, &w->job) != 0) {
            pthread_mutex_lock(&run.mu);
            run.left--;
            pthread_mutex_unlock(&run.mu);
            errors = join(errors, "the model is shutting down");
        }
    }
    pthread_mutex_lock(&run.mu);
    while (run.left > 0)
        pthread_cond_wait(&run.cv, &run.mu);
    pthread_mutex_unlock(&run.mu);
    for (size_t i = 0; i < n; i++) {
        if (jobs[i].job.status != NULL) {
            errors = join(errors, jobs[i].job.status->message);
            oi_status_free(jobs[i].job.status);
        }
        free(jobs[i].names);
    }
    free(jobs);
    pthread_cond_destroy(&run.cv);
    pthread_mutex_destroy(&run.mu);
    if (errors == NULL)
        return NULL;
    oi_status_t *st = oi_status_new(OI_BAD_REQUEST, "%s", errors);
    free(errors);
    return st;
}
