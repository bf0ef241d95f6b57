#include "backends/instances.h"

#include <stdlib.h>

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
    pthread_mutex_lock(&p->mu);
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

void oi__instances_release(oi__instances_t *p, int i)
{
    pthread_mutex_lock(&p->mu);
    p->busy[i] = 0;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}
