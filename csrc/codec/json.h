/* The V2 (Open Inference Protocol) JSON codec: inference requests in, inference responses and
 * errors out. Pure functions over caller-owned buffers: no I/O, no threads, no global state
 * beyond a "C" locale object created once on first use. */
#ifndef OI_CODEC_JSON_H
#define OI_CODEC_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"
#include "core/tensor.h"

/* The default nesting limit, and the most any caller may ask for: skipped values are walked
 * recursively, so the cap bounds the stack a hostile body can make the decoder use. */
#define OI_JSON_DEFAULT_DEPTH 64
#define OI_JSON_MAX_DEPTH 1024

/* Limits a request body must respect. */
typedef struct oi_json_limits_s {
    uint32_t max_depth; /* nesting depth of any JSON value (the top object is 1); 0 means 64,
                           values above OI_JSON_MAX_DEPTH are treated as OI_JSON_MAX_DEPTH */
} oi_json_limits_t;

/* Decodes a V2 inference request. body->data[0 .. json_len) holds the JSON and is mutable:
 * names and the id are unescaped and NUL-terminated in place, so they point into the body
 * (a number's following byte is also overwritten for a moment while it is converted).
 * `req` must be zeroed with binary_data_output = -1 beforehand; `limits` may be NULL.
 *
 * On success req->body holds a new reference to `body`. Inputs with a JSON "data" value get a
 * new buffer holding the elements packed little-endian in their datatype (BYTES: a 4-byte
 * little-endian length, then the bytes, per element). An input whose parameters name a
 * "shared_memory_region" carries no data (neither "data" nor binary_data_size may be given):
 * it gets `shm` set and data NULL, for the server to resolve; a response's output likewise.
 * Bytes body->data[json_len .. body->len)
 * are the binary tensor extension's data: inputs whose parameters carry "binary_data_size": N
 * take the next N bytes in JSON order, pointing into the body (owner: a new reference to
 * `body`); the sizes must add up to exactly body->len - json_len.
 *
 * Returns NULL, or a status (400 for a bad request, naming the field, what was expected and
 * what came; 500 when out of memory) that the caller frees; `req` is then left cleared. */
oi_status_t *oi_json_decode_infer_request(oi_buf_t *body, size_t json_len, oi_request_t *req,
                                          const oi_json_limits_t *limits);

/* A decoded V2 inference response, for clients. */
typedef struct oi_json_response_s {
    /* The response's outputs are in result.inputs/result.n_inputs (a tensor list shaped like
     * a request's), with result.id and result.parameters; result owns the body reference. */
    oi_request_t result;
    const char *model_name;    /* NUL-terminated, in the body; NULL when absent */
    const char *model_version; /* likewise */
} oi_json_response_t;

/* Decodes a V2 inference response like oi_json_decode_infer_request decodes a request
 * (in place; binary outputs are slices of the body after the JSON, zero-copy). `resp` is
 * overwritten. Returns NULL, or a status whose message names the field; free with
 * oi_request_clear(&resp->result). */
oi_status_t *oi_json_decode_infer_response(oi_buf_t *body, size_t json_len, oi_json_response_t *resp,
                                           const oi_json_limits_t *limits);

/* Appends a V2 inference response to `out`:
 * {"model_name":..,"model_version":..,"id":..,"outputs":[{"name":..,"datatype":..,"shape":[..],
 * "data":[..]},..]}. "model_version" is left out when model_version is NULL and "id" when
 * req is NULL or has no id. Output i goes binary (no "data", but
 * "parameters":{"binary_data_size":N}) when binary != NULL && binary[i]; the transport then
 * sends its bytes after the JSON. An output with `shm` set (written into a shared-memory
 * region) has neither: its parameters are "shared_memory_region", "shared_memory_byte_size"
 * and, when not 0, "shared_memory_offset", and `binary` is ignored for it. Floats are written as the shortest decimal that reads back
 * to the same value of their own type, formatted like Python's repr(float) ("0.1", "1.0",
 * "1e+20"), NaN and infinities as NaN, Infinity and -Infinity; BOOL as true/false; BYTES
 * elements as JSON strings. Returns NULL, or a status (400 when a BYTES element is not valid
 * UTF-8, 500 when an output's size does not fit its shape or memory runs out); `out` is then
 * back at its length on entry. */
oi_status_t *oi_json_encode_infer_response(oi_sbuf_t *out, const char *model_name,
                                           const char *model_version, const oi_request_t *req,
                                           const oi_response_t *resp, const uint8_t *binary);

/* Appends a V2 inference request for clients: every input as binary tensor data
 * ("binary_data_size": byte_size; the caller sends the bytes after the JSON, in order), every
 * named output with "binary_data": true (none named: all outputs, which the caller asks for
 * in binary with "binary_data_output" in `parameters`), `id` when not NULL and `parameters`
 * (raw JSON object text) when present. Returns 0 or -1 (out of memory; `out` unchanged). */
int oi_json_encode_infer_request(oi_sbuf_t *out, const oi_tensor_t *inputs, uint32_t n_inputs,
                                 const char *const *outputs, uint32_t n_outputs, const char *id,
                                 oi_slice_t parameters);

/* Tells whether the response output `output_name` goes binary: the "binary_data" parameter of
 * the request's output of that name wins, else the request's "binary_data_output", else no.
 * Returns 1 or 0. */
int oi_json_output_is_binary(const oi_request_t *req, const char *output_name);

/* One member of a "parameters" object, as oi_json_param found it. */
typedef enum {
    OI_JSON_PARAM_ABSENT = 0,
    OI_JSON_PARAM_STRING, /* decoded into the caller's buffer, NUL-terminated */
    OI_JSON_PARAM_COUNT,  /* a non-negative integer that fits int64 */
    OI_JSON_PARAM_OTHER,  /* any other value: a negative or fractional number, a boolean, ... */
} oi_json_param_kind_t;

typedef struct oi_json_param_s {
    oi_json_param_kind_t kind;
    int64_t count;  /* OI_JSON_PARAM_COUNT */
    size_t len;     /* OI_JSON_PARAM_STRING: the decoded length (the raw length when too_long) */
    int too_long;   /* OI_JSON_PARAM_STRING: did not fit the buffer, which is left untouched */
    oi_slice_t raw; /* the value's JSON text, whatever its kind (an object: look into it) */
} oi_json_param_t;

/* Looks up member `key` of a "parameters" object's text (what the decoders keep in
 * oi_tensor_t.parameters and friends), or of any JSON object (a small request body); the text
 * is read, never modified. A string value is
 * decoded into buf (cap bytes with the NUL). Returns 0 with out->kind ABSENT when the key is
 * not there or params.ptr is NULL, or -1 when the text is not a well-formed JSON object. */
int oi_json_param(oi_slice_t params, const char *key, oi_json_param_t *out, char *buf, size_t cap);

/* Whether two "parameters" objects' texts hold the same members in the same order (keys and
 * value texts byte for byte), members whose key is in `ignored` (NULL-terminated) left out
 * of both; a NULL text is the empty object. Malformed text is never the same. */
int oi_json_params_same(oi_slice_t a, oi_slice_t b, const char *const *ignored);

/* Calls `fn` for each member of a "parameters" object's text in order, members whose key is in
 * `ignored` (NULL-terminated) left out: the key (decoded) and the value's JSON text. A NULL
 * text has no members. Returns 0, or -1 when the text is not a well-formed object. */
int oi_json_params_each(oi_slice_t params, const char *const *ignored,
                        void (*fn)(void *ctx, const char *key, size_t key_len, oi_slice_t value), void *ctx);

/* A "parameters" object's text (well-formed, as the decoders keep it; NULL: none) with
 * `members` (n bytes of JSON object members, "k":"v",...) added after its own: a new
 * buffer, or NULL when out of memory. */
oi_buf_t *oi_json_params_extend(oi_slice_t params, const char *members, size_t n);

/* Appends {"error":"<message, escaped>"}; returns 0 or -1 (out of memory). */
int oi_json_encode_error(oi_sbuf_t *out, const char *message);

/* Appends the n bytes at `s` as a JSON string literal, quotes included, escaped per RFC 8259.
 * Bytes that are not valid UTF-8 become U+FFFD so that the output is always valid JSON.
 * Returns 0 or -1 (out of memory). */
int oi_json_write_string(oi_sbuf_t *out, const char *s, size_t n);

#endif
