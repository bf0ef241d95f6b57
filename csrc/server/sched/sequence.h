/* Triton's sequence batcher: requests that carry a correlation id (sequence_id) belong to one
 * stateful sequence, which runs its requests in order, one at a time, with control tensors
 * (START, END, READY, CORRID) and implicit state added to each. Requests of different
 * sequences batch together: with the Oldest strategy in the model's scheduler (its dynamic
 * batcher), with the Direct strategy here, each sequence keeping its row of one instance.
 *
 * A model serves at most `slots` sequences at once; a sequence that starts while every slot
 * is taken waits in a backlog until one frees (at most max_backlog sequences wait: past that
 * a new sequence is refused with 503). A sequence frees its slot when its END request has run,
 * when it was idle longer than idle_us, or when its client has gone: a request of it was
 * cancelled, or the gRPC stream its last request came on was (then a later request for it
 * without START is refused, as Triton refuses it). */
#ifndef OI_SERVER_SCHED_SEQUENCE_H
#define OI_SERVER_SCHED_SEQUENCE_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "server/sched/scheduler.h"

/* What a control input carries (Triton's ModelSequenceBatching.Control.Kind). */
typedef enum {
    OI_SEQ_CONTROL_START = 0,
    OI_SEQ_CONTROL_READY = 1,
    OI_SEQ_CONTROL_END = 2,
    OI_SEQ_CONTROL_CORRID = 3,
} oi_seq_control_kind_t;

/* One control input: a tensor of one element per request (shape [1], or [1, 1] on a batching
 * model) holding `false_true[0|1]` for a flag, or the correlation id for CORRID. */
typedef struct oi_seq_control_s {
    const char *name;
    oi_seq_control_kind_t kind;
    oi_dtype_t dtype;     /* flags: INT32, FP32 or BOOL; CORRID: UINT64, INT64, UINT32, INT32 or BYTES */
    double false_true[2]; /* flags only */
} oi_seq_control_t;

/* One implicit state: input `input_name` of each request is output `output_name` of the one
 * before it in the sequence (unless the batcher's states_follow_outputs is 0); the START
 * request gets `initial` (shape `dims`, the batch dimension included on a batching model). */
typedef struct oi_seq_state_s {
    const char *input_name;
    const char *output_name;
    oi_dtype_t dtype;
    int ndim;
    int64_t dims[OI_MAX_DIMS];
    const void *initial; /* its bytes (copied by oi_seq_new) */
    size_t initial_size;
} oi_seq_state_t;

/* Triton's Direct strategy: each sequence holds one batch row of one instance (executor) for
 * its whole life. An instance's batch has a row for each of its slots up to the last one with
 * a request ready; the others are padding (zeros, READY false, CORRID 0), which the model
 * must ignore and whose outputs are dropped. While fewer than `min_slot_utilization` of the
 * instance's max_batch_size rows are ready, the batch waits up to `max_queue_delay_us` after
 * its oldest request arrived (either 0: it never waits). */
typedef struct oi_seq_direct_s {
    int instances;           /* the scheduler's executors; 0: the Oldest strategy */
    uint64_t max_queue_delay_us;
    double min_slot_utilization;
} oi_seq_direct_t;

/* A model's sequence batching; everything is copied by oi_seq_new. */
typedef struct oi_seq_config_s {
    const char *model_name;
    int max_batch_size;
    int slots;        /* sequences served at once (>= 1); Direct: instances x max(1, max_batch_size) */
    uint64_t idle_us; /* max_sequence_idle_microseconds (> 0) */
    uint32_t max_backlog; /* sequences that may wait for a slot; 0: no limit (as Triton) */
    const oi_seq_control_t *controls;
    uint32_t n_controls;
    const oi_seq_state_t *states;
    uint32_t n_states;
    oi_seq_direct_t direct;
    /* 1: each state input is the sequence's last state output, which the model must produce (a
     * backend that updates the state, as Triton's TorchScript and ONNX backends call
     * TRITONBACKEND_StateUpdate). 0: every request gets the initial state and the state outputs
     * are not asked of the model (Triton's python_backend never updates a state). */
    int states_follow_outputs;
} oi_seq_config_t;

typedef struct oi_seq_s oi_seq_t;

/* A sequence batcher running its requests on `sched` (borrowed: it must outlive the batcher,
 * see oi_seq_free). Starts the thread that releases idle sequences. NULL with a message in
 * `err` on failure. */
oi_seq_t *oi_seq_new(const oi_seq_config_t *cfg, oi_scheduler_t *sched, char *err, size_t errlen);

/* Queues a request of a sequence. The job is the transport's, as for oi_scheduler_submit;
 * its `done` runs later on an executor thread, or on this thread when the job never runs.
 * The sequence now belongs to the request's session (req->seq.session). Returns NULL when
 * queued, else a status worded as Triton's (a missing id, a batch of more than one, a
 * sequence that is unknown or was released and gets no START, a CORRID of the wrong type), or
 * 503 for a new sequence when every slot is taken and max_backlog sequences wait already; then
 * nothing was queued. */
oi_status_t *oi_seq_submit(oi_seq_t *q, oi_job_t *job);

/* The job's clients have gone (after oi_job_cancel(job)): a request still waiting in its
 * sequence or in the backlog is dropped now (its `done` runs on this thread with a 499
 * status) and never reaches the model; one handed to the scheduler is cancelled there through
 * oi_job_cancel. Its sequence is cancelled with it, as Triton cancels it: released at once as
 * if idle past idle_us, its other waiting requests dropped (499) and its slot given to the
 * backlog as soon as nothing of it runs. Does nothing when the job is no longer the batcher's.
 * Any thread. */
void oi_seq_cancel(oi_seq_t *q, oi_job_t *job);

/* The client session `session` (> 0) has gone: every sequence whose last request came on it
 * and has not queued its END is released as oi_seq_cancel releases one, those that wait in
 * the backlog and those that hold a slot with nothing to run alike. Any thread. */
void oi_seq_release_session(oi_seq_t *q, uint64_t session);

/* Takes no more requests and fails those waiting in sequences (not yet in the scheduler)
 * with 503 now, calling their `done` on this thread. Requests already in the scheduler finish
 * there. Safe to call more than once. */
void oi_seq_stop(oi_seq_t *q);

/* Stops the batcher (oi_seq_stop), ends its idle thread and frees it with every sequence's
 * state. Call after oi_scheduler_free(sched): a request that scheduler still held calls back
 * into the batcher when it completes. */
void oi_seq_free(oi_seq_t *q);

#endif
