/* S5 driver: times openinfer's V2 JSON codec (csrc/codec/json_*.c) alone, with no server.
 *
 *   json_codec_bench BODY.json SECONDS [ENCODED_OUT]
 *
 * Decode: oi_json_decode_infer_request over a fresh copy of BODY each iteration (the decoder
 * works in place, so every iteration gets the original bytes; the copy is not timed).
 * Encode: oi_json_encode_infer_response of a response whose outputs are the decoded inputs
 * (the same tensors, so the same element values and datatypes) into a reused buffer.
 * Each phase runs at least 3 iterations and at least SECONDS. Prints one JSON line:
 * {"decode_ns": [...], "encode_ns": [...], "body_bytes": N, "encoded_bytes": M, "elements": E}.
 * With ENCODED_OUT, writes the last encoded response there (for checking).
 * Built by benchmarks/s5_json_codec.py with -O2 (as setup.py builds the extension). */
#define _POSIX_C_SOURCE 200809L

#include "codec/json.h"
#include "core/dtype.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void print_list(const char *key, const long long *v, int n)
{
    printf("\"%s\": [", key);
    for (int i = 0; i < n; i++)
        printf("%s%lld", i ? "," : "", v[i]);
    printf("]");
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s BODY.json SECONDS [ENCODED_OUT]\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    fseek(f, 0, SEEK_END);
    size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *src = malloc(n);
    if (!src || fread(src, 1, n, f) != n) {
        fprintf(stderr, "read failed\n");
        return 2;
    }
    fclose(f);
    double seconds = atof(argv[2]);
    enum { MAXIT = 100000 };
    static long long dec[MAXIT], enc[MAXIT];
    int nd = 0, ne = 0;

    /* Decode. */
    long long end = now_ns() + (long long)(seconds * 1e9);
    oi_request_t keep = {.binary_data_output = -1};
    int kept = 0;
    while (nd < MAXIT && (nd < 3 || now_ns() < end)) {
        oi_buf_t *body = oi_buf_new(n);
        memcpy(body->data, src, n);
        body->len = n;
        oi_request_t req = {.binary_data_output = -1};
        long long t0 = now_ns();
        oi_status_t *st = oi_json_decode_infer_request(body, n, &req, NULL);
        long long t1 = now_ns();
        if (st != NULL) {
            fprintf(stderr, "decode failed: %s\n", st->message);
            return 1;
        }
        dec[nd++] = t1 - t0;
        if (!kept) {
            keep = req;
            kept = 1;
        } else {
            oi_request_clear(&req);
        }
        oi_buf_unref(body);
    }

    /* Encode: outputs = the decoded inputs. */
    oi_response_t resp = {0};
    resp.outputs = calloc(keep.n_inputs ? keep.n_inputs : 1, sizeof(oi_tensor_t));
    resp.n_outputs = keep.n_inputs;
    for (uint32_t i = 0; i < keep.n_inputs; i++) {
        resp.outputs[i] = keep.inputs[i];
        /* The decoder (since the power-of-two buffer blocks of oi_buf_new) reports a JSON
         * "data" tensor's byte_size as its buffer's capacity, not elements x element size;
         * the encoder then refuses it ("needs N x 4 bytes, got M bytes"). Use the exact
         * size here, and report how often it differed. */
        int64_t c = 0;
        oi_shape_elements(keep.inputs[i].shape, keep.inputs[i].ndim, &c);
        size_t exact = (size_t)c * oi_dtype_size(keep.inputs[i].dtype);
        if (keep.inputs[i].dtype != OI_TYPE_BYTES && resp.outputs[i].byte_size != exact) {
            fprintf(stderr, "note: decoded '%s' has byte_size %zu, expected %zu\n",
                    keep.inputs[i].name, resp.outputs[i].byte_size, exact);
            resp.outputs[i].byte_size = exact;
        }
        if (resp.outputs[i].owner)
            oi_buf_ref(resp.outputs[i].owner);
    }
    int64_t elements = 0;
    for (uint32_t i = 0; i < keep.n_inputs; i++) {
        int64_t c = 0;
        oi_shape_elements(keep.inputs[i].shape, keep.inputs[i].ndim, &c);
        elements += c;
    }
    oi_sbuf_t out = {0};
    end = now_ns() + (long long)(seconds * 1e9);
    while (ne < MAXIT && (ne < 3 || now_ns() < end)) {
        out.len = 0;
        long long t0 = now_ns();
        oi_status_t *st = oi_json_encode_infer_response(&out, "m", "1", &keep, &resp, NULL);
        long long t1 = now_ns();
        if (st != NULL) {
            fprintf(stderr, "encode failed: %s\n", st->message);
            return 1;
        }
        enc[ne++] = t1 - t0;
    }
    if (argc > 3) {
        FILE *o = fopen(argv[3], "wb");
        if (!o || fwrite(out.data, 1, out.len, o) != out.len) {
            perror(argv[3]);
            return 2;
        }
        fclose(o);
    }
    printf("{");
    print_list("decode_ns", dec, nd);
    printf(", ");
    print_list("encode_ns", enc, ne);
    printf(", \"body_bytes\": %zu, \"encoded_bytes\": %zu, \"elements\": %lld}\n", n, out.len,
           (long long)elements);
    oi_sbuf_free(&out);
    oi_response_clear(&resp);
    oi_request_clear(&keep);
    free(src);
    return 0;
}
