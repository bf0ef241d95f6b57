/* The call chain of a BLS request: the models that wait, each in its execute, for the answer of
 * the request below them (Triton Python models' pb_utils.InferenceRequest.exec, in the server
 * or from a worker process). A call into a model already waiting up its own chain (A -> A,
 * A -> B -> A) would wait on itself for as long as that model has no free instance, so it is
 * refused at once, as is a call below OI_BLS_MAX_DEPTH waiting models. A chain is a string of
 * model names separated by '/' (which no model name holds), outermost first; NULL or "" is a
 * client's request. */
#ifndef OI_CORE_BLS_CHAIN_H
#define OI_CORE_BLS_CHAIN_H

#include "core/status.h"

#define OI_BLS_MAX_DEPTH 16

/* The chain of the BLS request that model `caller`, serving a request of chain `chain`, makes to
 * model `target`: `chain` with `caller` appended, in *out (malloc'd; free it). Returns NULL, or
 * a 400 status naming the chain ("BLS call cycle: a -> b -> a") when `target` is `caller` or
 * waits up the chain, or when the chain would pass OI_BLS_MAX_DEPTH calls (*out NULL then). */
oi_status_t *oi_bls_chain_extend(const char *chain, const char *caller, const char *target, char **out);

#endif
