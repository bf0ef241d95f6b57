/* Log probabilities for OpenAI's API: a model's `logprobs` output, as Triton's vLLM backend
 * writes it (per response a JSON list, one object per new token, {token_id: {"logprob",
 * "rank", "decoded_token"}}, the sampled token first), converted to OpenAI's shapes: a chat's
 * {"content": [{"token", "logprob", "bytes", "top_logprobs"}]} or a completion's {"text_offset",
 * "token_logprobs", "tokens", "top_logprobs"}. Pure functions over caller-owned buffers. */
#ifndef OI_CODEC_OPENAI_LOGPROBS_H
#define OI_CODEC_OPENAI_LOGPROBS_H

#include <stddef.h>
#include <stdint.h>

#include "codec/openai.h"
#include "core/buf.h"
#include "core/status.h"

/* The most alternatives a request may ask per token: OpenAI's bound on a chat's top_logprobs
 * (a completion's logprobs stops at 5). */
#define OI_OPENAI_MAX_TOP_LOGPROBS 20

/* The tokens converted so far and not yet written: a whole answer's, or a streamed chunk's. */
typedef struct oi_openai_logprobs_s {
    oi_openai_kind_t kind;
    int top;           /* alternatives per token: chat's top_logprobs, a completion's logprobs */
    size_t n;          /* tokens held */
    oi_sbuf_t items;   /* chat: "content"'s items; completions: "tokens"' items */
    oi_sbuf_t values;  /* completions: "token_logprobs"' items */
    oi_sbuf_t tops;    /* completions: "top_logprobs"' items */
    oi_sbuf_t offsets; /* completions: "text_offset"'s items */
    int64_t offset;    /* completions: the next token's offset in the answer's text, in characters */
} oi_openai_logprobs_t;

/* Adds the tokens of one response's `logprobs` element, json[0 .. len): its JSON text, a list
 * of tokens, or null (vLLM's "none asked"), which adds none and sets *none. Returns NULL, or a
 * 500 (the model's fault) whose message says what is wrong and where; the request is failed
 * then, and `lp` only freed. */
oi_status_t *oi_openai_logprobs_add(oi_openai_logprobs_t *lp, const char *json, size_t len, int *none);

/* Appends the tokens held as the value of a choice's "logprobs" (NULL: null). 0 or -1. */
int oi_openai_logprobs_write(oi_sbuf_t *out, const oi_openai_logprobs_t *lp);

/* The bytes the tokens held take once written (about). */
size_t oi_openai_logprobs_size(const oi_openai_logprobs_t *lp);

/* Forgets the tokens held (after a chunk carried them); a completion's offset goes on. */
void oi_openai_logprobs_clear(oi_openai_logprobs_t *lp);

void oi_openai_logprobs_free(oi_openai_logprobs_t *lp);

#endif
