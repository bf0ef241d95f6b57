/* A pool of a model's instances (ONNX Runtime sessions, TorchScript modules) for its
 * executors: each call takes a free instance, so each instance (and its device) runs one
 * request at a time. The backend keeps the instances themselves, indexed as here. */
#ifndef OI_BACKENDS_INSTANCES_H
#define OI_BACKENDS_INSTANCES_H

#include <pthread.h>

typedef struct oi__instances_s {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    unsigned char *busy; /* one flag per instance */
} oi__instances_t;

/* Makes a pool of `n` (>= 1) free instances. Returns 0, or -1 when out of memory. */
int oi__instances_init(oi__instances_t *p, int n);

/* Frees the pool; no call may be using it. Safe on a zeroed pool. */
void oi__instances_destroy(oi__instances_t *p);

/* Waits for a free instance, marks it busy and returns its index: the calling executor's own
 * (oi_thread_instance) when that one is free. */
int oi__instances_acquire(oi__instances_t *p);

/* Marks instance `i` busy if it is free, without waiting; returns whether it did (then
 * oi__instances_release gives it back). */
int oi__instances_try(oi__instances_t *p, int i);

/* Marks instance `i` (from oi__instances_acquire) free again and wakes one waiting caller. */
void oi__instances_release(oi__instances_t *p, int i);

#endif
