/* Triton's generate extension: the flat JSON of POST .../generate and .../generate_stream
 * turned into a V2 inference request, and a V2 response turned into the flat JSON answer.
 * Pure functions over caller-owned buffers (no I/O, no threads, no global state); the V2 JSON
 * codec does the typed work on both sides, so a generate request is judged like any other. */
#ifndef OI_CODEC_GENERATE_H
#define OI_CODEC_GENERATE_H

#include <stddef.h>

#include "core/buf.h"
#include "core/status.h"
#include "core/tensor.h"

/* Rewrites the generate request json[0 .. len) (a JSON object; empty: {}) for a model with
 * these declared inputs into a V2 inference request appended to `out`. As Triton maps it: a
 * top-level key that names an input becomes that input (a scalar or a flat array of values;
 * the shape comes from the declaration, its fixed dimensions dividing the element count and
 * the innermost variable one taking the rest, other variable ones 1); "id" is the request id;
 * "parameters" is an object mapped the same way; any other key is a request parameter (a
 * string, number or bool). Returns NULL, or a 400 status naming the key, what was expected
 * and what came (500 when out of memory). */
oi_status_t *oi_generate_request(const char *json, size_t len, const oi_io_spec_t *inputs, uint32_t n_inputs,
                                 oi_sbuf_t *out);

/* Rewrites a V2 inference response v2[0 .. len) (as the server's JSON encoder writes it, every
 * output as JSON data) into the generate answer appended to `out`: one flat object whose keys,
 * in byte order as Triton sorts them, are "id" (when not empty), "model_name",
 * "model_version", the response parameters and each output's name, an output with one element
 * as that value and any other as a flat array. Returns NULL or a 500 status. */
oi_status_t *oi_generate_response(const char *v2, size_t len, oi_sbuf_t *out);

#endif
