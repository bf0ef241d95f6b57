/* BLS from a worker process: a model in a worker makes an inference on the server (Triton's
 * pb_utils.InferenceRequest.exec) by sending OI_PW_BLS during its job; the executor that waits
 * for the job queues it on the target's scheduler through a hook the server gives (the backends
 * do not reach the registry) and goes on reading the worker's messages, so one worker has many
 * calls in flight at once (up to OI_PW_MAX_BLS_CALLS). As each call's responses come, the
 * executor (woken by the calls' eventfd) carries them back, tagged with the call's id. No socket
 * but the wire: the request's tensors are in the memfd the worker sent (viewed, not copied) or,
 * for an array the model took from its own request, in that request's memory on the server;
 * each response's in a memfd of its own.
 *
 * Both memfds are little-endian records; a string is a u32 length and its bytes.
 * Request: u32 n_inputs, u32 n_outputs, u32 flags (OI_PW_BLS_*), u32 0, u64 timeout_us,
 *   u64 sequence id; strings model, version, request id, parameters (JSON), sequence id string;
 *   n_inputs times: string name, string datatype, u32 ndim, u32 source, ndim i64 dims, u64
 *   offset, u64 byte size (source 0: the bytes at offset of the memfd; k > 0: the bytes at
 *   offset of input k-1 of the job the worker runs); n_outputs strings (the outputs asked).
 * Response: u32 n_outputs, u32 final (1: the target's final flag came with it), u32
 * parameters length, u32 0, then per output name, datatype, u32 ndim, ndim i64 dims, u64
 * offset, u64 byte size, then the response's parameters (JSON text, that many bytes; 0: none). */
#ifndef OI_BACKENDS_PROCESS_BLS_H
#define OI_BACKENDS_PROCESS_BLS_H

#include "backends/process_wire.h"
#include "core/tensor.h"

#define OI_PW_BLS_SEQ_START 1u
#define OI_PW_BLS_SEQ_END 2u
#define OI_PW_BLS_DECOUPLED 4u /* exec(decoupled=True): a decoupled target is allowed */

/* How the server runs a worker's BLS request. A call, once started, makes progress on other
 * threads; each response and its end write `wake_fd` (an eventfd) until it is released. */
typedef struct oi_pw_bls_hook_s {
    /* Queues `req` (taken: cleared by the callee; its bls_chain is copied) on model `model`
     * (version "" for the default). The call, or NULL with *st: refused at once. */
    void *(*start)(void *ctx, const char *model, const char *version, oi_request_t *req, uint32_t flags,
                   int wake_fd, oi_status_t **st);
    /* The call's next response into *resp: 1; 0 once it has ended (*st: NULL or its failure,
     * taken); -1 while neither is there. */
    int (*next)(void *call, oi_response_t *resp, oi_status_t **st);
    void (*cancel)(void *call);  /* a queued request is dropped, a running one sees the flag */
    void (*release)(void *call); /* cancels it; its eventfd is written no more */
    void *ctx;
} oi_pw_bls_hook_t;

/* The BLS calls one worker has in flight, by the worker's id; only its executor touches them. */
typedef struct oi_pw_bls_calls_s {
    const oi_pw_bls_hook_t *hook; /* NULL: BLS refused (UNSUPPORTED) */
    int wake;                     /* the calls' eventfd, kept for the worker's life */
    uint32_t n;
    struct {
        uint64_t id;
        void *call;
    } at[OI_PW_MAX_BLS_CALLS];
} oi_pw_bls_calls_t;

/* 0, or -1 (errno) when no eventfd could be made. */
int oi__pw_bls_init(oi_pw_bls_calls_t *c, const oi_pw_bls_hook_t *hook);
void oi__pw_bls_destroy(oi_pw_bls_calls_t *c);

/* Serves the OI_PW_BLS message (call `id`) that came on `sock` with `fd` (taken): parses the
 * request and starts it. One refused at once is answered with its BLS_END there: a malformed
 * request 400, a call back into model `caller_model` or another waiting up `caller`'s chain
 * (core/bls_chain.h) 400 naming the chain, one call too many 503. `caller` is the worker's own
 * request, whose inputs a request may name (source k). 0, or -1 when the worker is gone. */
int oi__pw_bls_start(oi_pw_bls_calls_t *c, int sock, uint64_t id, int fd, const oi_request_t *caller,
                     const char *caller_model);

/* Sends what the calls have made since: BLS_PART per response, BLS_END as one ends (it is
 * released then). Called as `wake` is readable. 0, or -1 when the worker is gone. */
int oi__pw_bls_forward(oi_pw_bls_calls_t *c, int sock);

/* Cancels call `id` (OI_PW_BLS_CANCEL; an id that has ended is ignored). */
void oi__pw_bls_cancel(oi_pw_bls_calls_t *c, uint64_t id);

/* Cancels every call (the clients of the worker's request have gone). */
void oi__pw_bls_cancel_all(oi_pw_bls_calls_t *c);

/* Ends every call: cancelled and released, each answered (`sock` >= 0) with BLS_END 499 and
 * `why`. For the job's end, and (sock -1) for a worker that died. */
void oi__pw_bls_end_all(oi_pw_bls_calls_t *c, int sock, const char *why);

#endif
