/* The responses of a decoupled model (0..N per request) on their way from the executor to the
 * transport, one at a time and in order, with back-pressure: a model that produces faster than
 * its client reads is held in its `send` once the responses not yet written reach a bound, so
 * that a slow or stalled reader costs the server a bounded amount of memory. */
#ifndef OI_SERVER_SCHED_DECOUPLED_H
#define OI_SERVER_SCHED_DECOUPLED_H

#include <stddef.h>

#include "core/tensor.h"
#include "transport/http1.h" /* oi_iov_t */

typedef struct oi_infer_s oi_infer_t;
typedef struct oi_dstream_s oi_dstream_t;

/* Response bytes (plus a fixed overhead per response) that may wait for a client before the
 * model is held: enough to keep a streaming reader busy, small beside any model. */
#define OI_DSTREAM_LIMIT ((size_t)1 << 20)

/* One response of a decoupled request, handed to the transport's `part` callback on the
 * request's loop thread. The callback owns `resp` for the call (what it leaves there is
 * released after it returns). */
typedef struct oi_infer_part_s {
    oi_task_t task;
    oi_infer_t *inf;
    oi_response_t resp;
    size_t credit; /* what the response counts against the bound */
    int held;      /* oi_infer_part_hold tied the credit to a written slice */
} oi_infer_part_t;

/* Called on the loop thread for each response but the request's end (which is `done`). */
typedef void (*oi_infer_part_cb)(oi_infer_t *inf, oi_infer_part_t *part);

/* Ties the part's credit to the slice `iov` (its owner is replaced by one that releases the
 * original and gives the credit back when the transport drops it: the bytes were written, or
 * dropped with the connection). Call at most once per part, for the slice that goes out last;
 * without it the credit comes back when the callback returns. Loop thread. */
void oi_infer_part_hold(oi_infer_part_t *part, oi_iov_t *iov);

/* For oi_infer_submit: readies `inf` (whose transport set `part`) for a decoupled model: the
 * request's `send` hands responses to `part`. Returns -1 when out of memory. */
int oi__dstream_attach(oi_infer_t *inf);

/* The request's client has gone (its job is marked cancelled, oi_job_cancel): a model held in
 * `send` wakes and returns at once (with 499). Any thread. */
void oi__dstream_cancel(oi_dstream_t *ds);

/* Drops the inference's reference to its stream. */
void oi__dstream_unref(oi_dstream_t *ds);

#endif
