/* libFuzzer target for the client half of the gRPC inference wire codec: decodes the input as a
 * ModelInferResponse and as a ModelStreamInferResponse and, for each that decodes, checks two
 * round trips through the writers: the outputs re-encoded as a ModelInferRequest (the client's
 * writer) must decode with the server's reader to the same tensors, and re-encoded as a
 * ModelInferResponse (the server's writer, plain and wrapped for streaming) must decode with
 * the client's reader to the same tensors. A mismatch aborts.
 *
 *   clang -g -fsanitize=fuzzer,address,undefined -Icsrc tests/fuzz/fuzz_pb_response.c
 *       csrc/core/[a-z]*.c csrc/codec/json_*.c csrc/codec/num.c csrc/codec/pb_infer.c -o fuzz_pb_response
 *
 * Built with -DOI_FUZZ_MAIN it has a main() that runs each file named on the command line
 * (with -v it prints what each decoded to), so that it also builds with gcc and replays a
 * corpus without libFuzzer. */
#include "codec/pb_infer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int verbose;

static void same_tensors(const oi_tensor_t *a, const oi_tensor_t *b, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (strcmp(a[i].name, b[i].name) != 0 || a[i].dtype != b[i].dtype || a[i].ndim != b[i].ndim ||
            a[i].byte_size != b[i].byte_size || memcmp(a[i].shape, b[i].shape, sizeof(int64_t) * (size_t)a[i].ndim))
            abort();
        if (a[i].byte_size > 0 && memcmp(a[i].data, b[i].data, a[i].byte_size) != 0)
            abort();
    }
}

/* Concatenates parts into one exactly sized message and drops their references. */
static oi_buf_t *join(oi_pb_iov_t *parts, size_t n, size_t total)
{
    oi_buf_t *m = oi_buf_new(total);
    for (size_t k = 0; k < n; k++) {
        if (m != NULL) {
            if (m->len + parts[k].len > total)
                abort(); /* the parts must add up to the announced length */
            memcpy(m->data + m->len, parts[k].base, parts[k].len);
            m->len += parts[k].len;
        }
        oi_buf_unref(parts[k].owner);
    }
    if (m != NULL && m->len != total)
        abort();
    return m;
}

/* The outputs as the inputs of a request, through the client's writer and the server's reader. */
static void request_round_trip(const oi_pb_response_t *r)
{
    const oi_request_t *res = &r->result;
    oi_pb_param_t params[2] = {
        {.key = "k", .type = OI_PB_PARAM_INT64, .i = -5},
        {.key = "s", .type = OI_PB_PARAM_STRING, .s = "x", .s_len = 1},
    };
    const char *outs[1] = {"o"};
    oi_pb_request_head_t head = {"m", r->model_version.ptr, res->id, params, 2, outs, 1};
    oi_pb_iov_t *parts = calloc(OI_PB_REQUEST_PARTS(res->n_inputs), sizeof(*parts));
    size_t n = 0, total = 0;
    if (parts == NULL)
        return;
    oi_status_t *st = oi_pb_encode_infer_request(&head, res->inputs, res->n_inputs, parts, &n, &total);
    if (st == NULL) {
        oi_buf_t *m = join(parts, n, total);
        oi_request_t req = {.binary_data_output = -1};
        oi_slice_t name, version;
        oi_status_t *st2 = m ? oi_pb_decode_infer_request(m, &req, &name, &version) : NULL;
        if (m != NULL) {
            if (st2 != NULL && st2->code != OI_INTERNAL)
                abort(); /* what the writer wrote, the reader reads */
            if (st2 == NULL) {
                if (req.n_inputs != res->n_inputs || req.n_outputs != 1 || strcmp(req.outputs[0].name, "o") != 0 ||
                    req.parameters.len != strlen("{\"k\":-5,\"s\":\"x\"}"))
                    abort();
                same_tensors(res->inputs, req.inputs, req.n_inputs);
                oi_request_clear(&req);
            }
            oi_status_free(st2);
            oi_buf_unref(m);
        }
    }
    oi_status_free(st);
    free(parts);
}

/* The outputs through the server's writer and back through the client's reader. */
static void response_round_trip(const oi_pb_response_t *r)
{
    const oi_request_t *res = &r->result;
    oi_response_t resp = {.outputs = res->inputs, .n_outputs = res->n_inputs}; /* borrowed */
    for (int stream = 0; stream < 2; stream++) {
        oi_pb_iov_t *parts = calloc(OI_PB_RESPONSE_PARTS(res->n_inputs), sizeof(*parts));
        size_t n = 0, total = 0;
        if (parts == NULL)
            return;
        oi_status_t *st = oi_pb_encode_infer_response("m", r->model_version.len ? r->model_version.ptr : NULL, res,
                                                      &resp, stream, parts, &n, &total);
        if (st == NULL) {
            oi_buf_t *m = join(parts, n, total);
            oi_pb_response_t back;
            oi_status_t *st2 = m ? oi_pb_decode_infer_response(m, stream, &back) : NULL;
            if (m != NULL) {
                if (st2 != NULL && st2->code != OI_INTERNAL)
                    abort();
                if (st2 == NULL) {
                    if (back.result.n_inputs != res->n_inputs || strcmp(back.model_name.ptr, "m") != 0 ||
                        (res->id != NULL) != (back.result.id != NULL) ||
                        (res->id && strcmp(res->id, back.result.id) != 0))
                        abort();
                    same_tensors(res->inputs, back.result.inputs, res->n_inputs);
                    oi_request_clear(&back.result);
                }
                oi_status_free(st2);
                oi_buf_unref(m);
            }
        }
        oi_status_free(st);
        free(parts);
    }
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
    for (int stream = 0; stream < 2; stream++) {
        oi_pb_response_t r;
        oi_status_t *st = oi_pb_decode_infer_response(msg, stream, &r);
        if (st != NULL) {
            if (verbose)
                printf("%s ERROR %d %s\n", stream ? "stream" : "unary", st->code, st->message);
            oi_status_free(st);
            continue;
        }
        if (verbose) {
            printf("%s OK model=%s version=%s id=%s params=%.*s outputs=%u error=%s\n", stream ? "stream" : "unary",
                   r.model_name.ptr, r.model_version.ptr, r.result.id ? r.result.id : "-", (int)r.result.parameters.len,
                   r.result.parameters.ptr ? r.result.parameters.ptr : "", r.result.n_inputs,
                   r.error_message.ptr ? r.error_message.ptr : "-");
            for (uint32_t i = 0; i < r.result.n_inputs; i++) {
                const oi_tensor_t *t = &r.result.inputs[i];
                printf("  output %s %s ndim=%d bytes=%zu inplace=%d data=", t->name, oi_dtype_name(t->dtype), t->ndim,
                       t->byte_size, t->owner == msg);
                for (size_t k = 0; k < t->byte_size; k++)
                    printf("%02x", (unsigned char)t->data[k]);
                printf("\n");
            }
        }
        request_round_trip(&r);
        response_round_trip(&r);
        oi_request_clear(&r.result);
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
