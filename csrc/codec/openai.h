/* OpenAI's API (/v1/completions, /v1/chat/completions) over Triton's LLM conventions: a request
 * body read into what the server maps onto a text model (text_input, stream,
 * sampling_parameters as a JSON string, exclude_input_in_output), and the answers written in
 * OpenAI's schemas: whole completions, streamed chunks and the error body. Pure functions over
 * caller-owned buffers (no I/O, no threads, no global state). */
#ifndef OI_CODEC_OPENAI_H
#define OI_CODEC_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"
#include "core/tensor.h"

typedef enum { OI_OPENAI_COMPLETION, OI_OPENAI_CHAT, OI_OPENAI_EMBEDDING } oi_openai_kind_t;

/* A request as read from its body: everything the server needs, or the field that is wrong. */
typedef struct oi_openai_request_s {
    oi_openai_kind_t kind;
    char model[256];      /* "model", decoded */
    oi_sbuf_t prompt;     /* completions: "prompt", decoded (no NUL) */
    oi_slice_t messages;  /* chat: the "messages" array's JSON text, inside the body */
    int stream;           /* "stream": true */
    int include_usage;    /* "stream_options": {"include_usage": true} */
    int echo;             /* completions: "echo": true */
    int logprobs;         /* log probabilities asked: a chat's "logprobs": true, any completion's "logprobs" */
    int top_logprobs;     /* the likeliest alternatives asked per token: a chat's "top_logprobs" (0
                           * unless given), a completion's "logprobs" */
    oi_slice_t input;     /* embeddings: "input"'s JSON text, a string or an array of strings */
    size_t n_inputs;      /* embeddings: how many strings */
    int base64;           /* embeddings: "encoding_format": "base64" */
    int64_t max_tokens;   /* "max_tokens" / "max_completion_tokens"; 0: not given */
    /* The sampling parameters given (max_tokens, stop, temperature, top_p, seed,
     * frequency_penalty, presence_penalty; logprobs: top_logprobs when asked) as one JSON
     * object's text, what vLLM's sampling_parameters input takes; empty (len 0) when none was
     * given. */
    oi_sbuf_t sampling;
    const char *sampling_first; /* the first of them, to name when a model takes none */
    char param[64];             /* on a refusal: the field it names ("" when none) */
} oi_openai_request_t;

/* Reads body json[0 .. len) as a request of `kind` into `out` (zeroed by the caller). Values
 * are checked against OpenAI's schema (types and ranges); a field OpenAI defines that this
 * server cannot honour (n > 1, tools, ...) is refused, and so is a field OpenAI does
 * not define, never ignored. Returns NULL, or a 400 status with out->param naming the field
 * (500 when out of memory). Free `out` with oi_openai_request_free in either case. */
oi_status_t *oi_openai_parse(const char *json, size_t len, oi_openai_kind_t kind, oi_openai_request_t *out);

void oi_openai_request_free(oi_openai_request_t *req);

/* Appends an embeddings answer: n vectors of `dim` little-endian FP32 values at `data` (any
 * alignment), each as a JSON array of floats (shortest round-trip decimals) or, with `base64`,
 * as its bytes in base64; usage counts `prompt_tokens` (-1: the model did not say: null). */
int oi_openai_encode_embeddings(oi_sbuf_t *out, const char *model, const char *data, size_t n, size_t dim,
                                int base64, int64_t prompt_tokens);

/* Appends OpenAI's error body {"error":{"message":..,"type":..,"param":..,"code":..}};
 * `param` and `code` NULL or "" write null. 0 or -1 (out of memory). */
int oi_openai_encode_error(oi_sbuf_t *out, const char *message, const char *type, const char *param,
                           const char *code);

/* What an answer says besides its text. */
typedef struct oi_openai_meta_s {
    oi_openai_kind_t kind;
    const char *id;    /* "cmpl-..." or "chatcmpl-..." */
    int64_t created;   /* Unix seconds */
    const char *model;
    int64_t prompt_tokens, completion_tokens; /* -1: the model did not say */
} oi_openai_meta_t;

/* A choice's log probabilities (codec/openai_logprobs.h); NULL writes "logprobs":null. */
struct oi_openai_logprobs_s;

/* Appends one streamed chunk as a Server-Sent Event ("data: {...}\n\n"): `text` as the
 * choice's delta (chat: with "role":"assistant" when `first`) and `lp` its tokens' log
 * probabilities, `finish_reason` NULL for null; "usage":null when `with_usage`
 * (stream_options.include_usage asks every chunk to carry it). 0 or -1. */
int oi_openai_encode_chunk(oi_sbuf_t *out, const oi_openai_meta_t *m, const char *text, size_t text_len,
                           const struct oi_openai_logprobs_s *lp, int first, const char *finish_reason,
                           int with_usage);

/* Appends the stream's usage chunk (no choices, the counts) as an event. 0 or -1. */
int oi_openai_encode_usage_chunk(oi_sbuf_t *out, const oi_openai_meta_t *m);

/* Appends a whole (unstreamed) completion: one choice with `text`, its log probabilities
 * `lp`, its finish reason and the usage (left out when the counts are unknown). 0 or -1. */
int oi_openai_encode_completion(oi_sbuf_t *out, const oi_openai_meta_t *m, const char *text, size_t text_len,
                                const struct oi_openai_logprobs_s *lp, const char *finish_reason);

#endif
