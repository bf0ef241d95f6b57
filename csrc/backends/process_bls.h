/* BLS from a worker process: a model in a worker makes an inference on the server (Triton's
 * pb_utils.InferenceRequest.exec) by sending OI_PW_BLS during its job; the executor that waits
 * for the job serves it through a hook the server gives (the backends do not reach the
 * registry), then carries the responses back. No socket but the wire: the request's tensors
 * are in the memfd the worker sent (viewed, not copied), each response's in a memfd of its own.
 *
 * Both memfds are little-endian records; a string is a u32 length and its bytes.
 * Request: u32 n_inputs, u32 n_outputs, u32 flags (OI_PW_BLS_*), u32 0, u64 timeout_us,
 *   u64 sequence id; strings model, version, request id, parameters (JSON), sequence id string;
 *   n_inputs times: string name, string datatype, u32 ndim, ndim i64 dims, u64 offset, u64
 *   byte size (the bytes at offset of the memfd); n_outputs strings (the outputs asked).
 * Response: u32 n_outputs, u32 final (1: the target's final flag came with it), u32
 * parameters length, u32 0, then per output as an input above, then the response's
 * parameters (JSON text, that many bytes; 0: none). */
#ifndef OI_BACKENDS_PROCESS_BLS_H
#define OI_BACKENDS_PROCESS_BLS_H

#include "core/tensor.h"

#define OI_PW_BLS_SEQ_START 1u
#define OI_PW_BLS_SEQ_END 2u
#define OI_PW_BLS_DECOUPLED 4u /* exec(decoupled=True): a decoupled target is allowed */

/* Runs `req` (taken: cleared by the callee) on model `model` (version "" for the default):
 * `part` gets each response (0 to go on, -1 to stop: the request is then cancelled); the
 * result is NULL or the status it ended with. `caller` is the worker's own request, whose
 * client going cancels this one. Blocks until the request ends. */
typedef struct oi_pw_bls_hook_s {
    oi_status_t *(*run)(void *ctx, const char *model, const char *version, oi_request_t *req, uint32_t flags,
                        int (*part)(void *arg, const oi_response_t *resp), void *arg, const oi_request_t *caller);
    void *ctx;
} oi_pw_bls_hook_t;

/* Serves the OI_PW_BLS message that came on `sock` with `fd` (taken): parses the request,
 * runs it through `hook` (NULL: refused, UNSUPPORTED) and sends BLS_PART... BLS_END. A
 * malformed request is answered with BLS_END 400, a call back into model `caller_model` or
 * another waiting up `caller`'s chain (core/bls_chain.h) with BLS_END 400 naming the chain.
 * Returns 0, or -1 when the worker is gone. */
int oi__pw_serve_bls(const oi_pw_bls_hook_t *hook, int sock, int fd, const oi_request_t *caller,
                     const char *caller_model);

#endif
