/* Triton's trace extension at levels TIMESTAMPS and TENSORS: which requests are traced
 * (sampling), and the trace file. Sampling is decided per request on the loop thread with atomics only: a request
 * of an untraced model costs one load, a traced one one counter increment. The timestamps of
 * a sampled request ride with it (the transports and the scheduler take them) and come back
 * here as one fixed-size record, queued without a lock; a writer thread of its own writes
 * the records as Triton's trace JSON. The settings are the application's (the control
 * thread sets them here); each model may have its own, else the global ones apply. */
#ifndef OI_SERVER_OBSERVE_TRACE_H
#define OI_SERVER_OBSERVE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

typedef struct oi_tracer_s oi_tracer_t;

/* The timestamps of one traced request, in the order they happen. HTTP_* are GRPC_WAITREAD_*
 * and GRPC_SEND_* for gRPC requests. */
typedef enum {
    OI_TS_RECV_START,
    OI_TS_RECV_END,
    OI_TS_REQUEST_START,
    OI_TS_QUEUE_START,
    OI_TS_COMPUTE_START,
    OI_TS_COMPUTE_INPUT_END,
    OI_TS_COMPUTE_OUTPUT_START,
    OI_TS_COMPUTE_END,
    OI_TS_REQUEST_END,
    OI_TS_SEND_START,
    OI_TS_SEND_END,
    OI_TS_COUNT
} oi_trace_point_t;

/* Trace levels, a mask as Triton's TRITONSERVER_InferenceTraceLevel: both may be on. */
#define OI_TRACE_TIMESTAMPS 1
#define OI_TRACE_TENSORS 2

/* Triton's tensor activities: the inputs as the request was queued, the outputs as the
 * response left the model. (Triton's core never reports TENSOR_BACKEND_INPUT.) */
typedef enum { OI_TRACE_QUEUE_INPUT, OI_TRACE_BACKEND_OUTPUT } oi_trace_activity_t;

/* A copy of one tensor of a traced request (level TENSORS), formatted by the writer. */
typedef struct oi_trace_tensor_s {
    struct oi_trace_tensor_s *next;
    oi_trace_activity_t activity;
    oi_dtype_t dtype;
    int ndim;
    int64_t shape[OI_MAX_DIMS];
    size_t byte_size;
    char *name; /* NUL-terminated, in the same allocation */
    char data[];
} oi_trace_tensor_t;

/* One traced request: monotonic ns (uv_hrtime's clock); 0 for a point it never reached. */
typedef struct oi_trace_rec_s {
    uint64_t id;
    int64_t model_version;
    int grpc;
    int level;            /* OI_TRACE_* mask it was sampled with */
    char model_name[128]; /* cut to fit */
    uint64_t ns[OI_TS_COUNT];
    oi_trace_tensor_t *tensors; /* owned list (level TENSORS); the writer frees it once pushed */
} oi_trace_rec_t;

/* Opens `path` for writing (truncated; with log_frequency, path.0, path.1, ... instead) and
 * starts the writer. Tracing is off until oi_tracer_set turns it on. NULL with a message in
 * `err` on failure. */
oi_tracer_t *oi_tracer_open(const char *path, char *err, size_t errlen);

/* Sets the settings of `model` (NULL: the global ones): level 0 off, else an OI_TRACE_* mask; one request
 * in `rate` traced (0: none); `count` more traces (-1: no limit); the file is flushed (a new
 * index file begun) every `log_frequency` traces (0: one file, written at close or when the
 * settings next change). `clear` drops the model's own settings: the global ones apply.
 * Control thread; returns 0 or -1 (out of memory, or too many models with settings of their
 * own). */
int oi_tracer_set(oi_tracer_t *t, const char *model, int clear, int level, uint32_t rate, int32_t count,
                  uint32_t log_frequency);

/* The traces `model` (NULL: the global settings) may still take (-1: no limit). */
int32_t oi_tracer_count(oi_tracer_t *t, const char *model);

/* Whether to trace a request for `model`: its trace id and its level mask in *level, or 0
 * (not traced; *level untouched). Any thread; no lock: an untraced model costs one atomic
 * load. `t` NULL: 0. */
uint64_t oi_tracer_sample(oi_tracer_t *t, const char *model, int *level);

/* Copies `n` tensors onto the end of rec->tensors for `activity` (level TENSORS). Runs for
 * traced requests only. -1 when out of memory (the tensors that fit are kept). */
int oi_trace_add_tensors(oi_trace_rec_t *rec, oi_trace_activity_t activity, const oi_tensor_t *tensors, uint32_t n);

/* Frees a tensor list. */
void oi_trace_tensors_free(oi_trace_tensor_t *list);

/* Queues a traced request's record for the writer, which takes rec->tensors (set to NULL
 * here); any thread, never blocks (dropped, tensors freed, and counted when the writer is
 * behind). */
void oi_tracer_push(oi_tracer_t *t, oi_trace_rec_t *rec);

/* Writes what is queued, closes the file and stops the writer. No other call may follow. */
void oi_tracer_close(oi_tracer_t *t);

#endif
