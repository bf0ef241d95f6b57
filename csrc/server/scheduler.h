/* Per-model-version executor threads fed by one FIFO queue. Transports submit jobs and get
 * them back through the job's `done` callback, on the executor thread. */
#ifndef OI_SERVER_SCHEDULER_H
#define OI_SERVER_SCHEDULER_H

#include <pthread.h>
#include <stddef.h>

#include "backends/backend.h"

typedef struct oi_job_s oi_job_t;

/* One request's trip through a backend. The submitter owns the job (embedded in its own
 * struct) and must keep it alive until `done` is called. */
struct oi_job_s {
    oi_job_t *next;
    const oi_request_t *req;
    const char *const *output_names;
    uint32_t n_outputs;
    oi_response_t resp;  /* filled by the backend */
    oi_status_t *status; /* NULL on success; the job's owner frees it */
    void (*done)(oi_job_t *job);
};

typedef struct oi_scheduler_s oi_scheduler_t;

/* Starts `instances` executor threads running `backend` on `state`, which the scheduler does
 * not own. Returns NULL with a message in `err` on failure. */
oi_scheduler_t *oi_scheduler_new(const oi_backend_t *backend, void *state, int instances, char *err,
                                 size_t errlen);

/* Queues a job; its `done` runs later on an executor thread. Returns 0, or -1 when the
 * scheduler is stopping (then `done` is never called). */
int oi_scheduler_submit(oi_scheduler_t *s, oi_job_t *job);

/* Stops the executors after their current job, fails queued jobs with 503 (calling their
 * `done` on this thread), joins the threads and frees the scheduler. */
void oi_scheduler_free(oi_scheduler_t *s);

#endif
