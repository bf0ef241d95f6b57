/* Model warm-up (config.pbtxt's model_warmup): requests run on a model version before it is
 * served, through the path real requests take (checked against the model's declaration,
 * queued on its scheduler, batched, executed, outputs checked), so that a model that fails
 * its warm-up is never served. The samples themselves are built by the caller. */
#ifndef OI_SERVER_SCHED_WARMUP_H
#define OI_SERVER_SCHED_WARMUP_H

#include <stddef.h>

#include "server/models/registry.h"

/* Submits the `n` requests (the caller's; it clears them afterwards) to `m`'s scheduler at
 * once and waits until every one is answered. Warm-up requests are not counted in the
 * statistics. Returns NULL when all succeeded, else a status whose message joins each
 * failure's ("input 'X': expected ...; ..."). Blocks: call it from a control thread without
 * the GIL (a Python model's executors need it), on a version with a scheduler. */
oi_status_t *oi_warmup_run(oi_model_t *m, oi_request_t *reqs, size_t n);

#endif
