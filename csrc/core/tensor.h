/* Tensors and the inference request/response they travel in. Pure data: no I/O, no
 * threads; one owner at a time (the transport, then the scheduler, then the transport). */
#ifndef OI_CORE_TENSOR_H
#define OI_CORE_TENSOR_H

#include <stdint.h>

#include "buf.h"
#include "dtype.h"
#include "status.h"

#define OI_MAX_DIMS 16

/* A borrowed span of text, e.g. the raw JSON of a `parameters` object. */
typedef struct oi_slice_s {
    const char *ptr; /* NULL when absent */
    size_t len;
} oi_slice_t;

/* A named tensor. `data` points into `owner`, of which the tensor holds one reference
 * (owner may be NULL only when byte_size is 0). */
typedef struct oi_tensor_s {
    const char *name; /* NUL-terminated; borrowed from the request body or the model spec */
    oi_dtype_t dtype;
    int ndim;
    int64_t shape[OI_MAX_DIMS];
    char *data;
    size_t byte_size;
    oi_buf_t *owner;
    oi_slice_t parameters; /* raw JSON object text; borrowed from the request body */
    /* The shared-memory extension. A request input whose parameters name a
     * "shared_memory_region" has `shm` set by the codecs and no data until the server points
     * it into the region. A response output with `shm` set was written into the region named
     * `shm_region` (borrowed from `owner`, the region) at `shm_offset`: encoders send its
     * metadata and those parameters, and none of its bytes. */
    uint8_t shm;
    const char *shm_region;
    uint64_t shm_offset;
    /* A response output the model left out (Triton lets a response carry only some of the
     * outputs): named, without data. oi_validate_response (and a BLS caller, for a decoupled
     * target's responses) drops it from the response, so only backends, a dynamic batch's
     * split, a sequence's state and the worker wire ever see one. */
    uint8_t absent;
} oi_tensor_t;

/* An output the client asked for, by name. */
typedef struct oi_output_request_s {
    const char *name;  /* NUL-terminated; borrowed from the request body */
    int binary_data;   /* -1 unset, 0 or 1 (binary tensor extension) */
    oi_slice_t parameters;
} oi_output_request_t;

/* The longest request id and tensor name accepted, in bytes: far beyond any real one, and
 * small enough that sending them back (the id with every answer, a name in error messages)
 * costs nothing, however far a compressed body inflated them. */
#define OI_MAX_ID_BYTES 4096
#define OI_MAX_NAME_BYTES 4096

/* A declared input or output: dims of -1 match any size, and ndim -1 any shape. */
typedef struct oi_io_spec_s {
    char *name;
    oi_dtype_t dtype;
    int ndim;
    int64_t dims[OI_MAX_DIMS];
    uint8_t optional; /* an input a request may leave out (Triton's `optional: true`) */
    uint8_t shape_as_produced; /* an output answered in the shape the model produced: Triton's
                                * core checks a Python-backend model's outputs by name only */
} oi_io_spec_t;

/* Triton's sequence parameters of a request ("sequence_id", "sequence_start",
 * "sequence_end"), read by the codecs and acted on by a model's sequence batcher. A
 * correlation id is numeric or a string, never both; 0 and "" mean none. */
typedef struct oi_seq_params_s {
    uint64_t id;        /* the numeric id; 0 when none or when the id is a string */
    const char *id_str; /* the string id (NUL-terminated, borrowed from the request's body or
                         * aux); NULL when none or numeric */
    size_t id_str_len;
    uint8_t start; /* sequence_start: true */
    uint8_t end;   /* sequence_end: true */
    /* The client session the request came on, set by the transport: a gRPC stream, whose
     * sequences are released when it is cancelled (oi_seq_release_session). 0: none (HTTP, a
     * unary call: only a request's own cancellation releases its sequence). */
    uint64_t session;
} oi_seq_params_t;

/* What a backend produced. Owns each output's owner reference. */
typedef struct oi_response_s {
    oi_tensor_t *outputs;
    uint32_t n_outputs;
    /* The model's response parameters (a Triton Python model's InferenceResponse(parameters=)):
     * a JSON object's text whose values are booleans, integers that fit int64 and strings, as
     * the encoders send them; one reference, NULL for none. */
    oi_buf_t *parameters;
    /* A decoupled model's last response for its request (Triton's final flag came with it):
     * the stream's end needs no empty response after it. */
    uint8_t final;
} oi_response_t;

/* A decoded inference request. Owns `body` and `aux` (one reference each), the arrays and each
 * input's owner reference. */
typedef struct oi_request_s {
    oi_buf_t *body;
    oi_buf_t *aux; /* text a codec derived from the body (NUL-terminated names, parameters
                    * rendered as JSON); the pointers above and below may point into it */
    const char *id; /* NUL-terminated, borrowed from body; NULL when absent */
    size_t id_len;
    oi_slice_t parameters;
    oi_buf_t *params_buf; /* owns `parameters` when a front door rewrote them (forwarded headers) */
    oi_tensor_t *inputs;
    uint32_t n_inputs;
    oi_output_request_t *outputs; /* none: every output of the model */
    uint32_t n_outputs;
    int binary_data_output; /* -1 unset, 0 or 1 */
    uint64_t timeout_us;    /* Triton's "timeout" parameter: the longest the request may wait in
                             * the queue before it is refused unrun; 0: no limit */
    uint64_t priority;      /* Triton's "priority" parameter: 1 is the highest level; 0, or past the
                             * model's priority_levels: the model's default level */
    oi_seq_params_t seq;
    /* Set by the scheduler for the backend's run: returns nonzero once every client waiting
     * for this request (or batch) has gone, so that a long-running model may stop early.
     * Callable from the executor thread during execute only; NULL: never cancelled. */
    int (*cancelled)(const void *arg);
    const void *cancelled_arg;
    /* Set by the server when the model is decoupled (many responses per request): hands one
     * response on to the client as soon as it is produced, taking what `resp` owns (left
     * zeroed). May block while the client reads slowly (back-pressure). Returns NULL, or a
     * status that the backend returns after stopping the model: the request was cancelled, or
     * the response was not what the model declares. Executor thread, during execute only. */
    oi_status_t *(*send)(void *arg, oi_response_t *resp);
    void *send_arg;
    /* Triton's "triton_enable_empty_final_response" request parameter: a decoupled model's
     * stream ends with an empty response flagged final. */
    uint8_t empty_final;
    /* Set by the scheduler on a dynamic batch it concatenated: the rows each of its n_batch
     * requests holds, in order, and their ids (NULL where a request has none); borrowed for the
     * backend's run, NULL otherwise. A backend that serves requests one by one (a Triton Python
     * model's execute(requests)) sees them apart by these. */
    const int64_t *batch_rows;
    const char *const *batch_ids;
    uint32_t n_batch;
    /* With batch_rows: each request's own parameters (`parameters` is the first one's), and
     * n_batch slots where the backend may fail one request of the batch alone (Triton's
     * per-request error responses): a status there goes to that request instead of its rows,
     * which the outputs must still hold. The scheduler owns both and what the slots hold. */
    const oi_slice_t *batch_params;
    oi_status_t **batch_errors;
    /* With batch_rows: n_batch slots where the backend may put each request's own response
     * parameters (Triton sends each response of a batch apart, with its own): one reference of
     * JSON text as oi_response_t.parameters holds, which goes to that request's response. The
     * scheduler owns the slots and what they hold. */
    oi_buf_t **batch_resp_params;
    /* With batch_rows: n_batch rows of one flag per output asked (request k's output i at
     * [k * n + i]) the backend sets where request k's own response left out an output that
     * others of the batch have (its rows there are filler): that request's response then has
     * it absent. The scheduler owns them. */
    uint8_t *batch_absent;
    /* A BLS request's call chain (core/bls_chain.h): the models waiting for it, '/'-separated,
     * outermost first; NULL for a client's. Borrowed from whoever made the request, for as
     * long as it runs; a dynamic batch carries its longest job's. */
    const char *bls_chain;
} oi_request_t;

/* Element count of a shape with overflow and sign checks: 0 and *count set, or -1 when a
 * dimension is negative or the shape is too large to lay out: the product of its non-zero
 * dimensions times 8 bytes (the widest element) must fit int64, even when a zero dimension
 * leaves no elements, since numpy and libtorch refuse such shapes too (a backend would
 * otherwise fail with a 500 on what is the client's mistake). */
int oi_shape_elements(const int64_t *shape, int ndim, int64_t *count);

/* Whose words oi_shape_refusal uses: tritonserver's HTTP frontend's (it checks a JSON tensor's
 * shape as it parses it), or its core's (the only check a gRPC request's shape meets). */
typedef enum { OI_WORDS_HTTP, OI_WORDS_CORE } oi_words_t;

/* tritonserver's refusal of a shape it cannot count (400): a negative dimension, an element
 * count past INT64_MAX, or (not for BYTES) a byte size past it, in `words`; `kind` and `name`
 * name the tensor ("input", "INPUT0"). NULL when tritonserver would count the shape: the
 * caller then gives its own reason (oi_shape_elements' limit is stricter). */
oi_status_t *oi_shape_refusal(const int64_t *shape, int ndim, oi_dtype_t dtype, const char *kind, const char *name,
                              oi_words_t words);

/* Writes "[2,16]" into `out` (at least 24*OI_MAX_DIMS bytes for any shape); returns out. */
char *oi_shape_format(const int64_t *shape, int ndim, char *out, size_t cap);

/* Triton's mapping of variable dimensions between a tensor's dims and its reshape (its
 * infer_request.cc for inputs, InferenceResponse::Output::Reshape for outputs): writes `to`
 * (to_n dims) into `out`, its k-th -1 replaced by shape[j] where from[j] is the k-th -1 of
 * `from` (`shape` lines up with `from`). Returns 0, or -1 when `to` has more -1s than `from`
 * (its -1s are then left as they are). */
int oi_shape_map_wildcards(const int64_t *from, int from_n, const int64_t *shape, const int64_t *to, int to_n,
                           int64_t *out);

/* The shape that input `t` (sent as `declared`, the batch dimension first when `batched`) has
 * for a model declaring `reshape` (Triton's reshape past the batch, ndim >= 0): dimension 0 as
 * sent when the model batches, then the reshape's dims, each -1 the size the request gave the
 * matching -1 of the declaration, into `shape` (OI_MAX_DIMS) and *ndim. NULL, or a 400 naming
 * the input when the element count would change. */
oi_status_t *oi_tensor_reshape(const oi_tensor_t *t, const oi_io_spec_t *declared, const oi_io_spec_t *reshape,
                               int batched, int64_t *shape, int *ndim);

/* Appends a zeroed tensor to a growable array; returns it or NULL (out of memory). */
oi_tensor_t *oi_tensor_push(oi_tensor_t **arr, uint32_t *n);

/* Drops a tensor's owner reference. */
void oi_tensor_clear(oi_tensor_t *t);

/* Releases everything a request owns and zeroes it (the struct itself is the caller's). */
void oi_request_clear(oi_request_t *r);

/* Releases everything a response owns and zeroes it. */
void oi_response_clear(oi_response_t *r);

/* Removes the outputs the model left out (oi_tensor_t.absent), keeping the others' order. */
void oi_response_drop_absent(oi_response_t *r);

/* The position of `name` among names[0..n): where a response's output stands among the outputs
 * asked (a checked response holds them in that order, some perhaps left out). n when not there. */
uint32_t oi_name_index(const char *const *names, uint32_t n, const char *name);

/* Refuses an input name, or a requested output name, that a request gives twice, in
 * tritonserver's core's words ("[request id: <id_unknown>] output 'X' already exists in
 * request"); `kind` names the tensors: "input", or "output" for a decoded response. Every
 * codec calls it, so that HTTP and gRPC judge a request alike. Returns NULL, or a 400 status
 * (500 when out of memory). */
oi_status_t *oi_request_check_unique(const oi_request_t *r, const char *kind);

/* Checks that byte_size fits shape x dtype (for BYTES: that the elements are well-formed
 * length-prefixed strings and their count matches). The message names the tensor as
 * "<kind> '<name>'" ("input 'X'"). Returns NULL or a 400 status. */
oi_status_t *oi_tensor_check_size(const oi_tensor_t *t, const char *kind, const char *name);

/* A request's input as it is decoded: only that its shape can be counted (oi_tensor_check_size's
 * words when not). Its byte size, or a BYTES input's elements, are checked once the model is
 * known (oi_tensor_check_input_size, oi_tensor_check_bytes), so that the errors name it as
 * Triton's do. */
oi_status_t *oi_tensor_check_input(const oi_tensor_t *t, const char *kind, const char *name);

/* tritonserver's "[request id: X]" prefix into `out` (X "<id_unknown>" when `id` is NULL or
 * ""); returns out. */
const char *oi_request_who(char *out, size_t cap, const char *id, size_t id_len);

/* Checks that a fixed-size input's byte_size fits its shape, in Triton's core's words:
 * "[request id: X] input byte size mismatch for input 'I' for model 'm'. Expected 32, got 40".
 * Returns NULL or a 400 status. */
oi_status_t *oi_tensor_check_input_size(const oi_tensor_t *t, const char *model, const char *id, size_t id_len);

/* Checks a BYTES input's elements as Triton's core does (InferenceRequest::ValidateBytesInputs),
 * with its words, naming the input, `model` and the request (`id`, NULL or "" when it has
 * none): "expected 3 string elements for inference input 'X' for model 'm', got 2",
 * "unexpected number of string elements 4 for inference input 'X' for model 'm', expecting 3",
 * "incomplete string length indicator ...". An element longer than the bytes left, which
 * Triton lets through, is refused too. Returns NULL or a 400 status. */
oi_status_t *oi_tensor_check_bytes(const oi_tensor_t *t, const char *model, const char *id, size_t id_len);

#endif
