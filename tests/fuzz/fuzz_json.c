/* libFuzzer target for the V2 JSON codec: decodes the input as a request body (all of it
 * JSON; then again with the bytes after the last '}' as binary data) and, when that
 * succeeds, encodes a response echoing the inputs as outputs, with the outputs the request
 * marks binary sent binary. Failures are encoded as error bodies.
 *
 *   clang -g -fsanitize=fuzzer,address,undefined -Icsrc tests/fuzz/fuzz_json.c
 *       csrc/core/[a-z]*.c csrc/codec/json_*.c csrc/codec/num.c -o fuzz_json
 *
 * Built with -DOI_FUZZ_MAIN it has a main() that runs each file named on the command line,
 * so that it also builds with gcc and replays a corpus without libFuzzer. */
#include "codec/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void echo(const oi_request_t *req)
{
    oi_response_t resp = {0};
    uint8_t *binary = calloc(req->n_inputs, 1);
    resp.outputs = calloc(req->n_inputs, sizeof(*resp.outputs));
    if (binary == NULL || resp.outputs == NULL)
        goto done;
    resp.n_outputs = req->n_inputs;
    for (uint32_t i = 0; i < req->n_inputs; i++) {
        resp.outputs[i] = req->inputs[i];
        if (resp.outputs[i].owner != NULL)
            oi_buf_ref(resp.outputs[i].owner);
        binary[i] = (uint8_t)oi_json_output_is_binary(req, req->inputs[i].name);
    }
    oi_sbuf_t out = {0};
    oi_status_t *st = oi_json_encode_infer_response(&out, "model", "1", req, &resp, binary);
    if (st != NULL) {
        oi_json_encode_error(&out, st->message);
        oi_status_free(st);
    }
    oi_sbuf_free(&out);
done:
    oi_response_clear(&resp);
    free(binary);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Decodes data[0 .. json_len) as the JSON of a body of `size` bytes. */
static void run(const uint8_t *data, size_t size, size_t json_len)
{
    /* An exact-size copy: the decoder writes into the body, and reads past it are caught. */
    oi_buf_t *body = oi_buf_new(size);
    if (body == NULL)
        return;
    if (size > 0)
        memcpy(body->data, data, size);
    body->len = size;
    oi_request_t req = {.binary_data_output = -1};
    oi_status_t *st = oi_json_decode_infer_request(body, json_len, &req, NULL);
    if (st == NULL) {
        echo(&req);
    } else {
        oi_sbuf_t out = {0};
        oi_json_encode_error(&out, st->message);
        oi_sbuf_free(&out);
        oi_status_free(st);
    }
    oi_request_clear(&req);
    oi_buf_unref(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    run(data, size, size);
    /* Whatever follows the last '}' is also tried as binary tensor data, which reaches the
     * binary_data_size slicing. */
    size_t json_len = size;
    while (json_len > 0 && data[json_len - 1] != '}')
        json_len--;
    if (json_len > 0 && json_len < size)
        run(data, size, json_len);
    return 0;
}

#ifdef OI_FUZZ_MAIN
int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (f == NULL) {
            perror(argv[i]);
            return 2;
        }
        char *buf = NULL;
        size_t len = 0, cap = 0, n;
        char chunk[65536];
        while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
            if (len + n > cap) {
                cap = (len + n) * 2;
                char *p = realloc(buf, cap);
                if (p == NULL) {
                    free(buf);
                    fclose(f);
                    return 2;
                }
                buf = p;
            }
            memcpy(buf + len, chunk, n);
            len += n;
        }
        fclose(f);
        LLVMFuzzerTestOneInput((const uint8_t *)buf, len);
        free(buf);
    }
    return 0;
}
#endif
