/* libFuzzer target for the gRPC inference wire codec: decodes the input as a
 * ModelInferRequest and, when that succeeds, encodes a ModelInferResponse (plain and wrapped
 * for streaming) echoing the inputs as outputs, checking that the parts add up to the
 * announced length; failures are encoded as a ModelStreamInferResponse error.
 *
 *   clang -g -fsanitize=fuzzer,address,undefined -Icsrc tests/fuzz/fuzz_pb_infer.c
 *       csrc/core/[a-z]*.c csrc/codec/json_*.c csrc/codec/num.c csrc/codec/pb_infer.c -o fuzz_pb_infer
 *
 * Built with -DOI_FUZZ_MAIN it has a main() that runs each file named on the command line
 * (and with -v prints what each decoded to), so that it also builds with gcc and replays a
 * corpus without libFuzzer. */
#include "codec/pb_infer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int verbose;

static void echo(const oi_request_t *req, const char *name, const char *version)
{
    oi_response_t resp = {0};
    resp.outputs = calloc(req->n_inputs ? req->n_inputs : 1, sizeof(*resp.outputs));
    if (resp.outputs == NULL)
        return;
    resp.n_outputs = req->n_inputs;
    for (uint32_t i = 0; i < req->n_inputs; i++) {
        resp.outputs[i] = req->inputs[i];
        if (resp.outputs[i].owner != NULL)
            oi_buf_ref(resp.outputs[i].owner);
    }
    for (int stream = 0; stream < 2; stream++) {
        oi_pb_iov_t *parts = calloc(OI_PB_RESPONSE_PARTS(resp.n_outputs), sizeof(*parts));
        size_t n = 0, total = 0, sum = 0;
        if (parts == NULL)
            break;
        oi_status_t *st = oi_pb_encode_infer_response(name, version[0] ? version : NULL, req, &resp, stream, parts,
                                                      &n, &total);
        for (size_t k = 0; k < n; k++) {
            sum += parts[k].len;
            oi_buf_unref(parts[k].owner);
        }
        if (st == NULL && sum != total)
            abort(); /* the parts must add up to the announced length */
        oi_status_free(st);
        free(parts);
    }
    oi_response_clear(&resp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size copy, so that reads past the message are caught. */
    oi_buf_t *msg = oi_buf_new(size);
    if (msg == NULL)
        return 0;
    if (size > 0)
        memcpy(msg->data, data, size);
    msg->len = size;
    oi_request_t req = {.binary_data_output = -1};
    oi_slice_t name, version;
    oi_status_t *st = oi_pb_decode_infer_request(msg, &req, &name, &version);
    if (st == NULL) {
        if (verbose) {
            printf("OK model=%s version=%s id=%s params=%.*s inputs=%u outputs=%u\n", name.ptr, version.ptr,
                   req.id ? req.id : "-", (int)req.parameters.len, req.parameters.ptr ? req.parameters.ptr : "",
                   req.n_inputs, req.n_outputs);
            for (uint32_t i = 0; i < req.n_inputs; i++) {
                const oi_tensor_t *t = &req.inputs[i];
                printf("  input %s %s ndim=%d bytes=%zu params=%.*s data=", t->name, oi_dtype_name(t->dtype), t->ndim,
                       t->byte_size, (int)t->parameters.len, t->parameters.ptr ? t->parameters.ptr : "");
                for (size_t k = 0; k < t->byte_size; k++)
                    printf("%02x", (unsigned char)t->data[k]);
                printf("\n");
            }
            for (uint32_t i = 0; i < req.n_outputs; i++)
                printf("  output %s params=%.*s\n", req.outputs[i].name, (int)req.outputs[i].parameters.len,
                       req.outputs[i].parameters.ptr ? req.outputs[i].parameters.ptr : "");
        }
        echo(&req, name.ptr, version.ptr);
        oi_request_clear(&req);
    } else {
        if (verbose)
            printf("ERROR %d %s\n", st->code, st->message);
        oi_sbuf_t out = {0};
        oi_pb_encode_stream_error(&out, st->message, "model", "1", "id", 2);
        oi_sbuf_free(&out);
        oi_status_free(st);
    }
    oi_buf_unref(msg);
    return 0;
}

#ifdef OI_FUZZ_MAIN
int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0) {
            verbose = 1;
            continue;
        }
        FILE *f = fopen(argv[i], "rb");
        if (f == NULL) {
            perror(argv[i]);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
        if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
            fclose(f);
            free(buf);
            return 1;
        }
        fclose(f);
        if (verbose)
            printf("== %s\n", argv[i]);
        LLVMFuzzerTestOneInput(buf, (size_t)n);
        free(buf);
    }
    return 0;
}
#endif
