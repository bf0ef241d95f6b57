/* Per-model-version executor threads fed by one FIFO queue, with an optional dynamic batcher
 * that runs compatible queued requests as one batch. Transports submit jobs and get them back
 * through the job's `done` callback, on the executor thread (or, for a quick model, on the
 * loop thread that submitted it: oi_scheduler_submit_on_loop). */
#ifndef OI_SERVER_SCHED_SCHEDULER_H
#define OI_SERVER_SCHED_SCHEDULER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "server/observe/counters.h"

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
    uint64_t enqueued_ns; /* set by submit when batching or counting: when the queue starts */
    uint64_t expires_ns;  /* set by submit from its level's queue policy (or req->timeout_us
                           * where the policy allows): past it, the job is refused unrun when
                           * an executor reaches it, or runs late (DELAY); 0: never */
    atomic_int cancelled; /* set by oi_job_cancel, from any thread */
    /* Set by submit, read under the scheduler's lock: the job's priority level (0-based),
     * whether its policy keeps it past expires_ns (DELAY) instead of refusing it, and whether
     * it has outwaited that timeout already (it then runs after its level's timely jobs). */
    uint32_t level;
    uint8_t delay;
    uint8_t delayed;
    /* Statistics. The submitter sets `counted` (and `rows`, the inferences it counts for:
     * dimension 0 of a batching model's request, else 1); the scheduler fills the rest
     * before `done`, which records the outcome in `slot`. */
    int counted;
    uint64_t rows;
    oi_stats_times_t times; /* times.start is enqueued_ns; compute_start 0: it never ran */
    oi_stats_slot_t *slot;  /* where `done` counts it; valid during `done` */
};

/* Whether the job (an oi_job_t) was cancelled: what a request's `cancelled` poll points at. */
int oi_job_cancelled(const void *job);

/* Triton's ModelQueuePolicy for one priority level. */
typedef struct oi_queue_policy_s {
    int delay;                   /* timeout_action DELAY: a request past its timeout still runs,
                                  * after its level's timely ones; 0: REJECT (refused unrun) */
    uint64_t default_timeout_us; /* 0: no timeout */
    int allow_override;          /* the request's "timeout" parameter replaces the default */
    uint32_t max_queue_size;     /* requests queued at this level; 0: no limit */
} oi_queue_policy_t;

/* Dynamic batching (Triton's dynamic_batching): requests queued for the model are gathered
 * into one call of up to max_batch_size rows (dimension 0), preferring the sizes listed,
 * waiting at most max_queue_delay_us after the oldest one arrived. Only requests with the
 * same inputs (names, datatypes, shapes past dimension 0), the same requested outputs and the
 * same parameters go together; outputs are split back along dimension 0 as views of the
 * batch's output (no copy). */
typedef struct oi_batching_s {
    int max_batch_size;         /* <= 0: no batching, every job runs alone at once */
    uint64_t max_queue_delay_us;
    int preferred[16];          /* preferred batch sizes, ascending or not; the first n count */
    int n_preferred;
    int ignore_parameters; /* requests with different parameters go together too (a sequence
                            * model's: each carries its own sequence_id) */
    uint32_t max_queue_size; /* default_queue_policy.max_queue_size: a request finding this many
                              * queued is refused at once with 503, as Triton; 0: no limit.
                              * Used only when n_levels is 0. */
    /* Triton's priority levels and queue policies. n_levels 0: one queue whose policy is
     * max_queue_size above, the request's own timeout always applying (what a model without
     * dynamic_batching does, and a sequence model's resubmitted requests). Else `policies`
     * holds one policy per level (level 1, the highest, first; borrowed, copied by
     * oi_scheduler_new_batching) and a request's "priority" p picks level p when
     * 1 <= p <= n_levels, else default_level (1-based), as Triton does. */
    const struct oi_queue_policy_s *policies;
    uint32_t n_levels;
    uint32_t default_level;
    /* Triton's preserve_ordering: responses leave in the order their requests were taken
     * from the queue, even when several instances run batches at once. An instance whose
     * batch ends before an earlier one waits for it before answering. */
    int preserve_ordering;
} oi_batching_t;

typedef struct oi_scheduler_s oi_scheduler_t;

/* The longest average execution that oi_scheduler_submit_on_loop runs on the submitting loop
 * thread: long enough for the small models whose hand-off to an executor and back (two thread
 * switches) costs as much as the model, short enough that the loop's other connections wait
 * no longer than a small request takes anyway. The environment variable
 * OPENINFER_RUN_ON_LOOP_MAX_US, read when a model loads, replaces it (0: never). */
#define OI_RUN_HERE_MAX_NS 50000u

/* An average execution this short runs on the loop even when the loop has run a model already
 * in its current turn: shorter than the hand-off it saves (the queue, an executor woken, the
 * answer posted back). Triton's identity backend, HTTP JSON, one CPU: 1.18x the requests/s at
 * 8 connections than with the first request of a turn only. Longer ones (a TorchScript call:
 * some µs of libtorch) gain from the executor running a burst while the loop reads. */
#define OI_RUN_ALWAYS_HERE_NS 2000u

/* Starts `instances` executor threads running `backend` on `state`, which the scheduler does
 * not own, with dynamic batching as `batching` says (copied; NULL: none). Returns NULL with a
 * message in `err` on failure. */
oi_scheduler_t *oi_scheduler_new_batching(const oi_backend_t *backend, void *state, int instances,
                                          const oi_batching_t *batching, char *err, size_t errlen);

/* The scheduler's statistics (never NULL once created): every executor counts its jobs in
 * its own slot. */
oi_stats_t *oi_scheduler_stats(const oi_scheduler_t *s);

/* Jobs queued and not yet taken by an executor (Triton's pending request count). */
int oi_scheduler_pending(const oi_scheduler_t *s);

/* Queues a job at the priority level its request names; its `done` runs later on an executor
 * thread, or at once on this thread when that level holds its policy's max_queue_size jobs
 * already (refused with Triton's 503 "Exceeds maximum queue size"). Returns 0, or -1 when the
 * scheduler is stopping (then `done` is never called). */
int oi_scheduler_submit(oi_scheduler_t *s, oi_job_t *job);

/* oi_scheduler_submit from a loop thread, which runs the job itself, `done` included, when
 * the backend allows it (runs_on_loop), the model does not batch or preserve ordering,
 * nothing is queued, an instance is free and the model's recent executions took less than
 * OI_RUN_HERE_MAX_NS (or OPENINFER_RUN_ON_LOOP_MAX_US) on average, if this is the first model
 * run of the loop's turn (`first`), else less than OI_RUN_ALWAYS_HERE_NS too: handing such a
 * model to an executor and back costs about as much as running it. `done` must not wait for
 * the loop. Returns 1 when the job ran here, else as oi_scheduler_submit. */
int oi_scheduler_submit_on_loop(oi_scheduler_t *s, oi_job_t *job, int first);

/* oi_scheduler_submit from the executor thread of a model whose BLS call waits for the job
 * (the target runs on the caller instead of passing the GIL to its executor and back: two
 * thread switches per call): runs the job here, `done` included, when the backend allows it
 * (runs_on_loop or runs_on_caller) and the conditions of oi_scheduler_submit_on_loop hold for
 * a first run of a turn. A run bounded so (OI_RUN_HERE_MAX_NS on average) ends before the
 * caller would notice that its own client went. Returns 1 when the job ran here, else as
 * oi_scheduler_submit. */
int oi_scheduler_submit_on_caller(oi_scheduler_t *s, oi_job_t *job);

/* Direct sequence batching: `jobs` (linked by `next`, row after row) run as one batch on
 * executor `instance` (0-based, below the instance count) alone: never merged with other
 * jobs, reordered, or dropped row by row (a cancelled row still runs, keeping every later row
 * in its place; a lone job that was cancelled is dropped as usual). Each job's `done` is
 * called in row order. The executor takes at most one such batch at a time: the submitter
 * sends the next one after the last `done` of the previous. A job that is not `counted` is
 * left out of the statistics. Returns 0, or -1 when the scheduler is stopping (then no
 * `done` is called). */
int oi_scheduler_submit_pinned(oi_scheduler_t *s, oi_job_t *jobs, int instance);

/* Whether two jobs can share a batch: the same inputs (names, datatypes, shapes past
 * dimension 0, each with a dimension 0) and the same requested outputs. Parameters are not
 * compared. */
int oi_jobs_batchable(const oi_job_t *a, const oi_job_t *b);

/* The job's clients have gone: marks it cancelled. An executor that reaches it in the queue,
 * or in a batch being formed, completes it with a 499 status without running it; a backend
 * already running it sees the flag through the request's `cancelled` poll. Only sets the
 * flag, so it is safe from any thread until the job's owner frees it, whatever became of the
 * scheduler. */
void oi_job_cancel(oi_job_t *job);

/* Takes no more jobs and fails the queued ones with 503 now (calling their `done` on this
 * thread); executors finish the job they are running, then end. Does not wait for them: for
 * a shutdown whose time is up while a model still runs. oi_scheduler_free still follows. */
void oi_scheduler_cancel_queued(oi_scheduler_t *s);

/* Stops the executors after their current job, fails queued jobs with 503 (calling their
 * `done` on this thread), joins the threads and frees the scheduler. */
void oi_scheduler_free(oi_scheduler_t *s);

#endif
