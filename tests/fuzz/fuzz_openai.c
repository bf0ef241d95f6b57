/* libFuzzer target for OpenAI's API codec (codec/openai.c, openai_logprobs.c): reads the input
 * as a completions, a chat and an embeddings request body and, when one is accepted, writes
 * every answer it can give from what was read (a whole completion, chunks, the usage chunk,
 * embeddings of the body's own bytes in both encodings); a refusal must name a status and a
 * message. It also reads the input as a model's `logprobs` output (vLLM backend's JSON) and
 * writes it in a chat's and a completion's shape; a refusal must be a 500 with a message.
 *
 * Built with -DOI_FUZZ_MAIN it replays files instead (tests/fuzz/replay_main.h). */
#include "codec/openai.h"
#include "codec/openai_logprobs.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static void answer(const oi_openai_request_t *req, const char *body, size_t size)
{
    oi_openai_meta_t meta = {req->kind, "cmpl-1", 1, req->model, (int64_t)req->prompt.len, req->max_tokens};
    const char *text = req->prompt.data ? req->prompt.data : "";
    oi_sbuf_t out = {0};
    oi_openai_logprobs_t lp = {.kind = req->kind, .top = req->top_logprobs};
    oi_openai_encode_completion(&out, &meta, text, req->prompt.len, req->logprobs ? &lp : NULL,
                                req->stream ? "stop" : NULL);
    oi_openai_encode_chunk(&out, &meta, text, req->prompt.len, NULL, req->echo, NULL, req->include_usage);
    oi_openai_encode_usage_chunk(&out, &meta);
    size_t dim = req->n_inputs ? req->n_inputs : 1, n = size / 4 / dim;
    oi_openai_encode_embeddings(&out, req->model, body, n, dim, req->base64, meta.prompt_tokens);
    oi_sbuf_free(&out);
}

/* The input as a model's logprobs output, for each shape, asking up to 20 alternatives. */
static void convert_logprobs(const char *body, size_t size)
{
    for (int kind = OI_OPENAI_COMPLETION; kind <= OI_OPENAI_CHAT; kind++) {
        oi_openai_logprobs_t lp = {.kind = (oi_openai_kind_t)kind, .top = (int)(size % 21)};
        int none;
        oi_status_t *st = oi_openai_logprobs_add(&lp, body, size, &none);
        if (st != NULL && (st->code != 500 || st->message[0] == '\0'))
            abort(); /* the model's fault, said */
        oi_status_free(st);
        oi_sbuf_t out = {0};
        oi_openai_logprobs_write(&out, &lp);
        oi_openai_logprobs_clear(&lp);
        oi_openai_logprobs_write(&out, &lp);
        oi_sbuf_free(&out);
        oi_openai_logprobs_free(&lp);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy: reads past the body are caught. */
    char *body = malloc(size ? size : 1);
    if (body == NULL)
        return 0;
    memcpy(body, data, size);
    for (int kind = OI_OPENAI_COMPLETION; kind <= OI_OPENAI_EMBEDDING; kind++) {
        oi_openai_request_t req = {0};
        oi_status_t *st = oi_openai_parse(body, size, (oi_openai_kind_t)kind, &req);
        if (st == NULL) {
            answer(&req, body, size);
        } else {
            if (st->code < 400 || st->message[0] == '\0')
                abort(); /* every refusal is a client or server error with a message */
            oi_sbuf_t out = {0};
            oi_openai_encode_error(&out, st->message, "invalid_request_error", req.param, NULL);
            oi_sbuf_free(&out);
            oi_status_free(st);
        }
        oi_openai_request_free(&req);
    }
    convert_logprobs(body, size);
    free(body);
    return 0;
}

#include "replay_main.h"
