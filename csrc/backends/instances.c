#include "backends/instances.h"

#include <stdlib.h>

#include "core/thread.h"

int oi__instances_init(oi__instances_t *p, int n)
{
    if ((p->busy = calloc((size_t)n, 1)) == NULL)
        return -1;
    p->n = n;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    return 0;
}

void oi__instances_destroy(oi__instances_t *p)
{
    if (p->busy == NULL)
        return;
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->busy);
    p->busy = NULL;
}

int oi__instances_acquire(oi__instances_t *p)
{
    int own = oi_thread_instance();
    pthread_mutex_lock(&p->mu);
    /* An executor takes its own instance when it is free: with one executor per instance, as
     * the server runs them, executor i always runs instance i. */
    if (own >= 0 && own < p->n && !p->busy[own]) {
        p->busy[own] = 1;
        pthread_mutex_unlock(&p->mu);
        return own;
    }
    for (;;) {
        for (int i = 0; i < p->n; i++)
            if (!p->busy[i]) {
                p->busy[i] = 1;
                pthread_mutex_unlock(&p->mu);
                return i;
            }
        pthread_cond_wait(&p->cv, &p->mu);
    }
}

int oi__instances_try(oi__instances_t *p, int i)
{
    pthread_mutex_lock(&p->mu);
    int got = !p->busy[i];
    p->busy[i] = 1;
    pthread_mutex_unlock(&p->mu);
    return got;
}

void oi__instances_release(oi__instances_t *p, int i)
{
    pthread_mutex_lock(&p->mu);
    p->busy[i] = 0;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}
