#include "server/scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/thread.h"

struct oi_scheduler_s {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    oi_job_t *head;
    oi_job_t *tail;
    int stopping;
    const oi_backend_t *backend;
    void *state;
    int nthreads;
    pthread_t threads[];
};

static oi_job_t *pop_locked(oi_scheduler_t *s)
{
    oi_job_t *j = s->head;
    if (j != NULL) {
        s->head = j->next;
        if (s->head == NULL)
            s->tail = NULL;
        j->next = NULL;
    }
    return j;
}

static void *executor(void *arg)
{
    oi_scheduler_t *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->head == NULL && !s->stopping)
            pthread_cond_wait(&s->cv, &s->mu);
        oi_job_t *j = s->stopping ? NULL : pop_locked(s);
        pthread_mutex_unlock(&s->mu);
        if (j == NULL)
            return NULL;
        j->status = s->backend->execute(s->state, j->req, j->output_names, j->n_outputs, &j->resp);
        j->done(j);
    }
}

oi_scheduler_t *oi_scheduler_new(const oi_backend_t *backend, void *state, int instances, char *err,
                                 size_t errlen)
{
    if (instances < 1)
        instances = 1;
    oi_scheduler_t *s = calloc(1, sizeof(*s) + (size_t)instances * sizeof(pthread_t));
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->backend = backend;
    s->state = state;
    for (int i = 0; i < instances; i++) {
        int rc = oi_thread_create(&s->threads[i], executor, s, 0);
        if (rc != 0) {
            snprintf(err, errlen, "cannot start an executor thread: %s", strerror(rc));
            oi_scheduler_free(s);
            return NULL;
        }
        s->nthreads++;
    }
    return s;
}

int oi_scheduler_submit(oi_scheduler_t *s, oi_job_t *job)
{
    job->next = NULL;
    job->status = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    if (s->tail)
        s->tail->next = job;
    else
        s->head = job;
    s->tail = job;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

void oi_scheduler_free(oi_scheduler_t *s)
{
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; i++)
        pthread_join(s->threads[i], NULL);
    oi_job_t *j;
    while ((j = pop_locked(s)) != NULL) {
        j->status = oi_status_new(OI_UNAVAILABLE, "the server is shutting down");
        j->done(j);
    }
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
