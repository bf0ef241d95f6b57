/* The two hot messages of the gRPC service, ModelInferRequest and ModelInferResponse, read and
 * written on the protobuf wire directly (protobuf-c serves every other message). The reason
 * is DESIGN §1: protobuf-c copies `bytes` fields on unpack, while here raw tensor contents are
 * used in place in the received message and outputs leave from the backend's memory. Pure
 * functions over caller-owned buffers: no I/O, no threads, no global state. */
#ifndef OI_CODEC_PB_INFER_H
#define OI_CODEC_PB_INFER_H

#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"
#include "core/tensor.h"

/* A slice of an encoded message and the owner of its bytes, of which the slice holds one
 * reference (NULL for none). The same layout as the transports' oi_iov_t. */
typedef struct oi_pb_iov_s {
    const char *base;
    size_t len;
    oi_buf_t *owner;
} oi_pb_iov_t;

/* Decodes a ModelInferRequest held in msg->data[0 .. msg->len); `msg` is not modified.
 * `req` must be zeroed with binary_data_output = -1 beforehand.
 *
 * On success req->body holds a new reference to `msg`, and req->aux a new buffer with every
 * name, the id and the model name and version NUL-terminated, and each `parameters` map
 * rendered as the JSON object text the HTTP side would have received ({"key": true | 12 |
 * 1.5 | "text" | null, ...}), so that parameters mean the same whatever the transport.
 * Inputs given in raw_input_contents point into `msg` (owner: a new reference to it); inputs
 * given as typed `contents` get a new buffer with the elements packed little-endian in their
 * datatype (BYTES: a 4-byte little-endian length before each element). Inputs whose
 * parameters hold a "shared_memory_region" get `shm` set and no data (the server resolves
 * them); raw_input_contents then lists the other inputs only, in order. *model_name and
 * *model_version point into req->aux (the version is "" when absent).
 *
 * Returns NULL, or a status that the caller frees: 400 for a malformed or inconsistent
 * message, naming the field, what was expected and what came (malformed varint, truncated
 * field, wrong wire type, an id or tensor name longer than OI_MAX_ID_BYTES / OI_MAX_NAME_BYTES,
 * unknown datatype, sizes that do not match shape x datatype, raw and
 * typed contents both given, a count of raw contents other than the count of inputs not in
 * shared memory), 500
 * when out of memory. `req` is then left cleared. */
oi_status_t *oi_pb_decode_infer_request(oi_buf_t *msg, oi_request_t *req, oi_slice_t *model_name,
                                        oi_slice_t *model_version);

/* Finds the id (field 3) of a ModelInferRequest that may be malformed elsewhere, so that an
 * error answer can still name the request; *id points into `data`. 0, or -1 when there is
 * none, it is longer than OI_MAX_ID_BYTES (not to be sent back), or the message breaks
 * before it. */
int oi_pb_peek_request_id(const char *data, size_t len, oi_slice_t *id);

/* What oi_pb_encode_infer_response's `stream` asks for: a ModelInferResponse alone, or wrapped
 * in a ModelStreamInferResponse whose infer_response carries Triton's response parameter
 * triton_final_response (true: the request's last response; false: more will follow). */
enum { OI_PB_UNARY = 0, OI_PB_STREAM_FINAL = 1, OI_PB_STREAM_MORE = 2 };

/* The most slices oi_pb_encode_infer_response writes for `n_outputs` outputs. */
#define OI_PB_RESPONSE_PARTS(n_outputs) (2 * (size_t)(n_outputs) + 1)

/* Encodes a ModelInferResponse with model name, version (left out when NULL), the request's
 * id (when req is not NULL and has one), one InferOutputTensor per output and each output's
 * bytes as raw_output_contents in the same order (the order tritonclient reads them by).
 * An output with `shm` set (written into shared memory) gets the parameters
 * shared_memory_region, shared_memory_byte_size and (when not 0) shared_memory_offset, and an
 * empty raw_output_contents entry, as Triton sends it.
 * With `stream` (OI_PB_STREAM_*), the message is wrapped as the infer_response of a
 * ModelStreamInferResponse and flagged final or not. The field headers and lengths go into one new small buffer and
 * each output's bytes are referenced where the backend left them, so the message is the
 * concatenation of parts[0 .. *nparts): `parts` must have room for
 * OI_PB_RESPONSE_PARTS(resp->n_outputs) entries, and each written part holds a new reference
 * to its owner (drop them with oi_buf_unref). *total is the message length. Returns NULL, or
 * a 500 status (out of memory, or a message over 4 GiB, which gRPC cannot frame); nothing is
 * written then. */
oi_status_t *oi_pb_encode_infer_response(const char *model_name, const char *model_version,
                                         const oi_request_t *req, const oi_response_t *resp, int stream,
                                         oi_pb_iov_t *parts, size_t *nparts, size_t *total);

/* Appends a ModelStreamInferResponse carrying `error_message` and an infer_response with the
 * model name, version and request id of the failed request (each left out when NULL or
 * empty) and triton_final_response true (an error ends its request), as Triton sends it.
 * Returns 0 or -1 (out of memory; `out` is then back at its length on entry). */
int oi_pb_encode_stream_error(oi_sbuf_t *out, const char *error_message, const char *model_name,
                              const char *model_version, const char *id, size_t id_len);

/* ---- the client's side ------------------------------------------------------------------- */

/* One request parameter (an InferParameter map entry); strings are borrowed. */
enum { OI_PB_PARAM_BOOL, OI_PB_PARAM_INT64, OI_PB_PARAM_UINT64, OI_PB_PARAM_DOUBLE, OI_PB_PARAM_STRING };
typedef struct oi_pb_param_s {
    const char *key; /* NUL-terminated */
    int type;        /* OI_PB_PARAM_* */
    int b;
    int64_t i;
    uint64_t u;
    double d;
    const char *s; /* OI_PB_PARAM_STRING: s_len bytes */
    size_t s_len;
} oi_pb_param_t;

/* Everything of a ModelInferRequest but the inputs; every pointer is borrowed. */
typedef struct oi_pb_request_head_s {
    const char *model_name;    /* NUL-terminated */
    const char *model_version; /* NULL or "" for the server's choice */
    const char *id;            /* NULL or "" for none */
    const oi_pb_param_t *params;
    size_t n_params;
    const char *const *outputs; /* names of the outputs wanted; none: every output */
    uint32_t n_outputs;
} oi_pb_request_head_t;

/* The most slices oi_pb_encode_infer_request writes for `n_inputs` inputs. */
#define OI_PB_REQUEST_PARTS(n_inputs) (2 * (size_t)(n_inputs) + 1)

/* Encodes a ModelInferRequest, the mirror of oi_pb_encode_infer_response: the fields of `head`,
 * one InferInputTensor per input (name, datatype, shape) and each input's bytes as
 * raw_input_contents in the same order, referenced where they are (an array's own memory:
 * nothing is copied). All field headers and lengths are computed up front and go into one new
 * small buffer, so the message is the concatenation of parts[0 .. *nparts), whose length *total
 * is known before anything is sent. `parts` must have room for OI_PB_REQUEST_PARTS(n_inputs)
 * entries; each written part holds a new reference to its owner (NULL for an input without
 * one). Returns NULL, or a status (400 for a message over 4 GiB, 500 when out of memory);
 * nothing is written then. */
oi_status_t *oi_pb_encode_infer_request(const oi_pb_request_head_t *head, const oi_tensor_t *inputs,
                                        uint32_t n_inputs, oi_pb_iov_t *parts, size_t *nparts, size_t *total);

/* A decoded ModelInferResponse (or ModelStreamInferResponse), for clients. */
typedef struct oi_pb_response_s {
    /* The outputs are in result.inputs[0 .. result.n_inputs) (a tensor list shaped like a
     * request's, as oi_json_decode_infer_response has it), with result.id and result.parameters
     * (JSON text); result owns the message reference, aux, and each output's owner reference. */
    oi_request_t result;
    oi_slice_t model_name;    /* NUL-terminated in result.aux; "" when absent */
    oi_slice_t model_version; /* likewise */
    oi_slice_t error_message; /* a stream response's error_message, NUL-terminated in result.aux;
                               * {NULL, 0} when empty */
} oi_pb_response_t;

/* Decodes a ModelInferResponse held in msg->data[0 .. msg->len), or with `stream` set a
 * ModelStreamInferResponse (error_message and the wrapped infer_response, which may be
 * absent). The reverse of the server's reader: raw_output_contents are used in place (each
 * output's owner is a new reference to `msg`), typed `contents` are packed into a new buffer
 * per output, names and ids are NUL-terminated in result.aux. `resp` is overwritten. Returns
 * NULL, or a status that the caller frees (400 naming the field for a malformed or
 * inconsistent message, 500 when out of memory), `resp` then zeroed. Free a decoded response
 * with oi_request_clear(&resp->result). */
oi_status_t *oi_pb_decode_infer_response(oi_buf_t *msg, int stream, oi_pb_response_t *resp);

#endif
