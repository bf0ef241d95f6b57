/* One inference on its way through the server, whatever the transport: the transport
 * decodes into `req`, submits, and gets `done` back on its loop thread to encode the
 * response. */
#ifndef OI_SERVER_INFER_H
#define OI_SERVER_INFER_H

#include "server/sched/decoupled.h"
#include "server/models/registry.h"
#include "server/shm/shm.h"
#include "server/observe/trace.h"
#include "transport/loop.h"

typedef struct oi_infer_s oi_infer_t;

/* Called on the submitting loop's thread when the backend has run (or failed). */
typedef void (*oi_infer_done_cb)(oi_infer_t *inf);

struct oi_infer_s {
    oi_job_t job; /* job.status and job.resp hold the outcome */
    oi_task_t task;
    oi_loop_t *loop;
    oi_model_t *model;         /* one reference, from submit on */
    oi_request_t req;          /* the transport's decoded request */
    const char **output_names; /* what to produce, in response order */
    uint32_t *class_counts;    /* per output: its top-k classes instead of the tensor when > 0
                                * (the classification extension); NULL: none asked */
    oi_infer_done_cb done;
    void *ctx;                  /* the transport's */
    /* The transport's own work on the executor thread once the response has been checked
     * (the legacy API ranks its classes there); its status fails the request. NULL: none. */
    oi_status_t *(*post)(oi_infer_t *inf);
    oi_shm_t *shm;              /* borrowed: the server's regions; set by the transport before
                                 * submit (NULL: shared-memory tensors are refused) */
    oi_shm_caller_t shm_caller; /* who asks, valid until submit returns; set with `shm` */
    oi_shm_target_t *shm_out;   /* where requested outputs go (NULL: none in shared memory) */
    oi_shm_uses_t shm_uses;     /* the regions the request named, released once it is done */
    int count_stats;            /* count it in the model's statistics; set by the transport
                                 * from the server's config before submit */
    int cancelled;              /* oi_infer_cancel was called (loop thread only) */
    oi_infer_t *prev, *next;    /* the transport's list of the requests of one call */
    oi_tracer_t *tracer;        /* with `trace`: where the record goes */
    oi_trace_rec_t *trace;      /* a sampled request's timestamps (owned); NULL: not traced */
    /* Decoupled models: the transport sets `part` before submit to take each response as it
     * comes (`done` then ends the request, its own response empty); NULL refuses such models. */
    oi_infer_part_cb part;
    oi_dstream_t *ds; /* their flow control (one reference), set by submit */
    int final_sent;   /* a response flagged final went (oi_response_t.final): the end adds none */
    uint64_t cache_miss_ns; /* > 0: the response cache missed, after this long; the answer is
                             * kept on the executor when the model succeeds */
};

/* Returns a zeroed inference ready for decoding into `req`, or NULL (out of memory). */
oi_infer_t *oi_infer_new(void);

/* Adds the request headers a transport forwarded (n bytes of JSON object members; none when
 * n is 0) to the decoded request's parameters, as tritonserver's header forward patterns do.
 * Returns NULL, or a status (out of memory). */
oi_status_t *oi_infer_forward_headers(oi_request_t *req, const char *members, size_t n);

/* NULL when the model version can serve, else a 503 status with the reason. */
oi_status_t *oi_model_check_ready(const oi_model_t *m);

/* Checks readiness, resolves shared-memory inputs and outputs (inf->shm), checks the request
 * against the model's declaration, then queues it. Outputs requested in shared memory are
 * written there on the executor thread before `done`. Only a request queued here is counted
 * in the model's statistics (as success or failure), as Triton counts the requests that
 * reach the model, not those refused before. Takes the reference to `m` in every case.
 * Called on `loop`'s thread, which may run a quick model at once (oi_scheduler_submit_on_loop).
 * Returns NULL when queued (`done` runs later on `loop`) or a status when nothing was queued. */
oi_status_t *oi_infer_submit(oi_infer_t *inf, oi_model_t *m, oi_loop_t *loop, oi_infer_done_cb done, void *ctx);

/* The client of a submitted inference has gone (its connection closed, its stream was reset,
 * its deadline passed): a queued request is dropped unrun when an executor reaches it (with a
 * 499 status), a running one is marked so that its model may stop early. `done` still comes
 * exactly once and the caller still frees the inference there; it should write nothing.
 * Loop thread, between a successful submit and `done`'s call. */
void oi_infer_cancel(oi_infer_t *inf);

/* Before submit: samples the request for tracing (oi_tracer_sample) and, when it is traced,
 * notes that it was received from `recv_start` to `recv_end` (monotonic ns). `t` NULL: no
 * tracing. Returns -1 when out of memory (the request then goes untraced), else 0. */
int oi_infer_trace_begin(oi_infer_t *inf, oi_tracer_t *t, const oi_model_t *m, int grpc, uint64_t recv_start,
                         uint64_t recv_end);

/* In `done`, for a traced request: its response was handed to the transport between
 * `send_start` and now; the record goes to the tracer. */
void oi_infer_trace_end(oi_infer_t *inf, uint64_t send_start);

/* Frees the inference, its request, response, status and model reference. */
void oi_infer_free(oi_infer_t *inf);

#endif
