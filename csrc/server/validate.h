/* Checks a decoded request against a model's declaration, and a backend's outputs against
 * it, so that backends only ever see well-formed tensors. */
#ifndef OI_SERVER_VALIDATE_H
#define OI_SERVER_VALIDATE_H

#include "server/models/registry.h"

/* Checks inputs (names, datatypes, shapes, batch size) and requested outputs. On success
 * sets *names to a new array (free() it) of the outputs to produce, in response order, and
 * *n to its length, and *classes to NULL, or, when some output asks for the classification
 * extension, to a new array (free() it) of each output's class count (0: the plain tensor).
 * Returns NULL or a 400 status. */
oi_status_t *oi_validate_request(const oi_model_t *m, const oi_request_t *req, const char ***names, uint32_t *n,
                                 uint32_t **classes);

/* Checks that a backend produced the asked outputs with declared datatypes and shapes and
 * consistent sizes, then drops those it left out (oi_tensor_t.absent), as Triton's core sends
 * a response with the outputs it has: the response's outputs stay in the order of `names`.
 * Returns NULL or a 500 status. */
oi_status_t *oi_validate_response(const oi_model_t *m, const char *const *names, uint32_t n, oi_response_t *resp);

#endif
