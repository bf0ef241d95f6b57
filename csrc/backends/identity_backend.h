/* Triton's identity backend (`backend: "identity"`): output OUTPUT<i> is input INPUT<i>, the
 * same bytes, datatype and shape, answered without a copy (the output holds a reference to
 * the input's memory). Used to test and measure everything around a model: with no work of
 * its own, it runs on the loop that read the request. */
#ifndef OI_BACKENDS_IDENTITY_BACKEND_H
#define OI_BACKENDS_IDENTITY_BACKEND_H

#include <stdint.h>

#include "backends/backend.h"

/* Without a delay: quick, may run on a loop thread. */
extern const oi_backend_t oi_identity_backend;
/* With execute_delay_ms: sleeps in execute, so it never runs on a loop. */
extern const oi_backend_t oi_identity_delayed_backend;

/* The state for either backend (which owns it), pairing each output OUTPUT<i> with input
 * INPUT<i> of the model's declaration (max_batch_size > 0: dimension 0 is the batch); each
 * execute sleeps `delay_ms`, times the executor's instance number times `delay_multiplier`
 * when that is set (Triton's instance_wise_delay_multiplier). NULL with a new message in *err
 * (free() it) when an output has no input of its index, or out of memory. */
void *oi_identity_backend_state(const char *model_name, int max_batch_size, const oi_io_spec_t *inputs,
                                uint32_t n_inputs, const oi_io_spec_t *outputs, uint32_t n_outputs,
                                uint64_t delay_ms, uint64_t delay_multiplier, char **err);

#endif
