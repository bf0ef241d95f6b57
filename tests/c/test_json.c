/* Unit tests of the V2 JSON codec (csrc/codec/json_*.c). Prints one line per failed check and
 * then "N passed, M failed"; exits non-zero on any failure.
 *
 * With --echo it instead decodes a request body from stdin and prints the response that
 * echoes its inputs as outputs (exit 1 and an error body when decoding fails), which lets the
 * Python tests compare the float text with Python's own. */
#define _GNU_SOURCE /* memmem */

#include "codec/json.h"

#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;

static void check(int ok, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void check(int ok, int line, const char *fmt, ...)
{
    if (ok) {
        passed++;
        return;
    }
    failed++;
    printf("FAIL test_json.c:%d: ", line);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

#define CHECK(cond) check(!!(cond), __LINE__, "%s", #cond)
#define CHECKF(cond, ...) check(!!(cond), __LINE__, __VA_ARGS__)

/* ---- Helpers ------------------------------------------------------------------------------ */

/* A decoded request together with the body it points into. */
typedef struct decoded_s {
    oi_buf_t *body;
    oi_request_t req;
    oi_status_t *st;
} decoded_t;

/* Decodes n bytes of JSON followed by a binary tail; the body is allocated to the exact size
 * so that AddressSanitizer catches any read past it. */
static void decode_raw(decoded_t *d, const char *json, size_t n, const void *tail, size_t tail_len,
                       uint32_t max_depth)
{
    d->body = oi_buf_new(n + tail_len);
    if (n)
        memcpy(d->body->data, json, n);
    if (tail_len)
        memcpy(d->body->data + n, tail, tail_len);
    d->body->len = n + tail_len;
    memset(&d->req, 0, sizeof(d->req));
    d->req.binary_data_output = -1;
    oi_json_limits_t limits = {max_depth};
    d->st = oi_json_decode_infer_request(d->body, n, &d->req, &limits);
}

static void decode(decoded_t *d, const char *json) { decode_raw(d, json, strlen(json), NULL, 0, 0); }

static void release(decoded_t *d)
{
    oi_request_clear(&d->req);
    oi_status_free(d->st);
    oi_buf_unref(d->body);
}

static int request_is_clear(const oi_request_t *r)
{
    return r->body == NULL && r->inputs == NULL && r->n_inputs == 0 && r->outputs == NULL &&
           r->n_outputs == 0 && r->id == NULL && r->binary_data_output == -1;
}

#define EXPECT_ERROR(json, substr) expect_error(__LINE__, json, strlen(json), NULL, 0, 0, substr)
/* An error tritonserver answers with 500 (its JSON library's words), as it does. */
#define EXPECT_INTERNAL(json, substr) expect_failure(__LINE__, OI_INTERNAL, json, strlen(json), NULL, 0, 0, substr)

static void expect_failure(int line, int code, const char *json, size_t n, const void *tail, size_t tail_len,
                           uint32_t depth, const char *substr)
{
    decoded_t d;
    decode_raw(&d, json, n, tail, tail_len, depth);
    check(d.st != NULL && d.st->code == code && strstr(d.st->message, substr) != NULL,
          line, "expected a %d containing \"%s\" for %.200s; got %d \"%s\"", code, substr, json,
          d.st ? d.st->code : 0, d.st ? d.st->message : "(success)");
    check(request_is_clear(&d.req), line, "request not cleared after an error");
    check(atomic_load(&d.body->refs) == 1, line, "body reference kept after an error");
    release(&d);
}

static void expect_error(int line, const char *json, size_t n, const void *tail, size_t tail_len, uint32_t depth,
                         const char *substr)
{
    expect_failure(line, OI_BAD_REQUEST, json, n, tail, tail_len, depth, substr);
}

/* A one-input request the decoder passes on, whose input `refuse` (given model "m", request id
 * "r1") refuses with exactly `message`. */
static void expect_passed_on(int line, const char *json, const char *tail, size_t tail_len,
                             oi_status_t *(*refuse)(const oi_tensor_t *, const char *, const char *, size_t),
                             const char *message)
{
    decoded_t d;
    decode_raw(&d, json, strlen(json), tail, tail_len, 0);
    check(d.st == NULL && d.req.n_inputs == 1, line, "input refused by the decoder: %s", d.st ? d.st->message : "");
    oi_status_t *st = d.st == NULL ? refuse(&d.req.inputs[0], "m", "r1", 2) : NULL;
    check(st != NULL && strcmp(st->message, message) == 0, line, "got \"%s\"", st ? st->message : "(success)");
    oi_status_free(st);
    release(&d);
}

/* Encodes a response whose outputs are the request's inputs; returns the JSON (malloc'd) or
 * NULL with *st set. */
static char *echo(const oi_request_t *req, const uint8_t *binary, const char *version,
                  oi_status_t **st)
{
    oi_response_t resp = {0};
    resp.outputs = calloc(req->n_inputs ? req->n_inputs : 1, sizeof(oi_tensor_t));
    resp.n_outputs = req->n_inputs;
    for (uint32_t i = 0; i < req->n_inputs; i++) {
        resp.outputs[i] = req->inputs[i];
        if (resp.outputs[i].owner)
            oi_buf_ref(resp.outputs[i].owner);
    }
    oi_sbuf_t out = {0};
    *st = oi_json_encode_infer_response(&out, "m", version, req, &resp, binary);
    oi_response_clear(&resp);
    if (*st != NULL) {
        oi_sbuf_free(&out);
        return NULL;
    }
    oi_sbuf_append(&out, "", 1);
    return out.data;
}

/* Decodes `json`, echoes it, and checks that the response contains `want`. */
#define ROUND_TRIP(json, want) round_trip(__LINE__, json, want)

static void round_trip(int line, const char *json, const char *want)
{
    decoded_t d;
    oi_status_t *st = NULL;
    decode(&d, json);
    check(d.st == NULL, line, "decode failed: %s", d.st ? d.st->message : "");
    char *out = d.st == NULL ? echo(&d.req, NULL, NULL, &st) : NULL;
    check(out != NULL && strstr(out, want) != NULL, line, "expected %s in %s (%s)", want,
          out ? out : "(none)", st ? st->message : "");
    free(out);
    oi_status_free(st);
    release(&d);
}

/* Decodes a one-input request of the given datatype and data, and checks its bytes. */
#define EXPECT_BYTES(dtype, shape, data, bytes, n) \
    expect_bytes(__LINE__, dtype, shape, data, (const char *)(bytes), n)

static void expect_bytes(int line, const char *dtype, const char *shape, const char *data,
                         const char *bytes, size_t n)
{
    char json[4096];
    snprintf(json, sizeof(json),
             "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"%s\",\"shape\":%s,\"data\":%s}]}", dtype,
             shape, data);
    decoded_t d;
    decode(&d, json);
    check(d.st == NULL, line, "decode failed: %s", d.st ? d.st->message : "");
    if (d.st == NULL) {
        oi_tensor_t *t = &d.req.inputs[0];
        check(t->byte_size == n && memcmp(t->data, bytes, n) == 0, line,
              "%s %s: got %zu bytes, want %zu", dtype, data, t->byte_size, n);
    }
    release(&d);
}

static uint16_t fp16_of(const char *text)
{
    char json[256];
    uint16_t h = 0xffff;
    snprintf(json, sizeof(json),
             "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP16\",\"shape\":[1],\"data\":[%s]}]}", text);
    decoded_t d;
    decode(&d, json);
    if (d.st == NULL)
        memcpy(&h, d.req.inputs[0].data, 2);
    release(&d);
    return h;
}

static uint16_t bf16_of(const char *text)
{
    char json[256];
    uint16_t h = 0xffff;
    snprintf(json, sizeof(json),
             "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BF16\",\"shape\":[1],\"data\":[%s]}]}", text);
    decoded_t d;
    decode(&d, json);
    if (d.st == NULL)
        memcpy(&h, d.req.inputs[0].data, 2);
    release(&d);
    return h;
}

/* Encodes `count` elements of `dtype` held in `data`; returns the text inside "data":[...]. */
static char *encode_values(oi_dtype_t dtype, const void *data, size_t size, int64_t count)
{
    oi_buf_t *b = oi_buf_new(size);
    memcpy(b->data, data, size);
    b->len = size;
    oi_tensor_t t = {.name = "y", .dtype = dtype, .ndim = 1, .shape = {count}, .data = b->data,
                     .byte_size = size, .owner = b};
    oi_response_t resp = {.outputs = &t, .n_outputs = 1};
    oi_sbuf_t out = {0};
    oi_status_t *st = oi_json_encode_infer_response(&out, "m", NULL, NULL, &resp, NULL);
    oi_buf_unref(b);
    if (st != NULL) {
        printf("encode failed: %s\n", st->message);
        oi_status_free(st);
        return NULL;
    }
    /* The text ends with the element list's "]}" and the response's "]}". */
    char *start = memmem(out.data, out.len, "\"data\":[", 8);
    char *s = NULL;
    if (start != NULL && out.len >= 4) {
        start += 8;
        size_t n = (size_t)(out.data + out.len - 4 - start);
        s = malloc(n + 1);
        memcpy(s, start, n);
        s[n] = '\0';
    }
    oi_sbuf_free(&out);
    return s;
}

/* ---- Tests -------------------------------------------------------------------------------- */

static void test_all_types(void)
{
    static const uint8_t b[] = {1, 0, 1};
    EXPECT_BYTES("BOOL", "[3]", "[true,false,true]", b, 3);
    static const uint8_t u8[] = {0, 255};
    EXPECT_BYTES("UINT8", "[2]", "[0,255]", u8, 2);
    static const uint16_t u16[] = {0, 65535};
    EXPECT_BYTES("UINT16", "[2]", "[0,65535]", u16, 4);
    static const uint32_t u32[] = {0, 4294967295u};
    EXPECT_BYTES("UINT32", "[2]", "[0,4294967295]", u32, 8);
    static const uint64_t u64[] = {0, UINT64_MAX};
    EXPECT_BYTES("UINT64", "[2]", "[0,18446744073709551615]", u64, 16);
    static const int8_t i8[] = {-128, 127};
    EXPECT_BYTES("INT8", "[2]", "[-128,127]", i8, 2);
    static const int16_t i16[] = {-32768, 32767};
    EXPECT_BYTES("INT16", "[2]", "[-32768,32767]", i16, 4);
    static const int32_t i32[] = {INT32_MIN, INT32_MAX, -0};
    EXPECT_BYTES("INT32", "[3]", "[-2147483648,2147483647,-0]", i32, 12);
    static const int64_t i64[] = {INT64_MIN, INT64_MAX};
    EXPECT_BYTES("INT64", "[2]", "[-9223372036854775808,9223372036854775807]", i64, 16);
    static const float f32[] = {0.1f, -2.5f, 1e-45f, 3.4028234663852886e38f};
    EXPECT_BYTES("FP32", "[4]", "[0.1,-2.5,1e-45,3.4028234663852886e38]", f32, 16);
    static const double f64[] = {0.1, 1.0 / 3, 5e-324, 1.7976931348623157e308, -0.0};
    EXPECT_BYTES("FP64", "[5]", "[0.1,0.3333333333333333,5e-324,1.7976931348623157e308,-0.0]",
                 f64, 40);
    static const uint16_t f16[] = {0x3e00, 0x7bff, 0x0002, 0x8000};
    EXPECT_BYTES("FP16", "[4]", "[1.5,65504,1e-7,-0.0]", f16, 8);
    static const uint16_t bf[] = {0x3f80, 0x3dcd, 0xc049};
    EXPECT_BYTES("BF16", "[3]", "[1,0.1,-3.140625]", bf, 6);
    EXPECT_BYTES("BYTES", "[3]", "[\"abc\",\"\",\"a\\u0000b\"]",
                 "\3\0\0\0abc\0\0\0\0\3\0\0\0a\0b", 18);
    EXPECT_BYTES("BYTES", "[2]", "[\"\\u00e9\\ud83d\\ude00\",\"q\\\"\\\\\\/\\b\\f\\n\\r\\t\"]",
                 "\6\0\0\0\xc3\xa9\xf0\x9f\x98\x80\x09\0\0\0q\"\\/\b\f\n\r\t", 23);

    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BOOL\",\"shape\":[3],\"data\":[true,false,true]}]}",
               "{\"name\":\"x\",\"datatype\":\"BOOL\",\"shape\":[3],\"data\":[true,false,true]}");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"UINT8\",\"shape\":[2],\"data\":[0,255]}]}",
               "\"data\":[0,255]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"UINT16\",\"shape\":[2],\"data\":[7,65535]}]}",
               "\"data\":[7,65535]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"UINT32\",\"shape\":[1],\"data\":[4294967295]}]}",
               "\"data\":[4294967295]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"UINT64\",\"shape\":[2],\"data\":[0,18446744073709551615]}]}",
               "\"data\":[0,18446744073709551615]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[3],\"data\":[-128,127,-1]}]}",
               "\"data\":[-128,127,-1]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT16\",\"shape\":[2],\"data\":[-32768,32767]}]}",
               "\"data\":[-32768,32767]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT32\",\"shape\":[2],\"data\":[-2147483648,2147483647]}]}",
               "\"data\":[-2147483648,2147483647]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT64\",\"shape\":[3],\"data\":[-9223372036854775808,9223372036854775807,0]}]}",
               "\"data\":[-9223372036854775808,9223372036854775807,0]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP16\",\"shape\":[6],\"data\":[1.5,-0.0,65504,1e-7,0.1,-2]}]}",
               "\"datatype\":\"FP16\",\"shape\":[6],\"data\":[1.5,-0.0,65500.0,1e-07,0.1,-2.0]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BF16\",\"shape\":[4],\"data\":[1,0.1,-3.140625,1e30]}]}",
               "\"data\":[1.0,0.1,-3.14,1e+30]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[8],\"data\":[0.1,1,3.4028234663852886e38,1e-45,NaN,Infinity,-Infinity,0.3333333432674408]}]}",
               "\"data\":[0.1,1.0,3.4028235e+38,1e-45,NaN,Infinity,-Infinity,0.33333334]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP64\",\"shape\":[12],\"data\":[0.3333333333333333,0.1,1e20,5e-324,1.7976931348623157e308,123.456,-0.0001,1e16,1e-5,0.30000000000000004,9007199254740993,1234567890123456.7]}]}",
               "\"data\":[0.3333333333333333,0.1,1e+20,5e-324,1.7976931348623157e+308,123.456,-0.0001,1e+16,1e-05,0.30000000000000004,9007199254740992.0,1234567890123456.8]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"BYTES\",\"shape\":[4],\"data\":[\"abc\",\"\",\"a\\u0000b\",\"\\u00e9\\ud83d\\ude00 q\\\"\\\\\\/\\n\\u001f\\u007f\"]}]}",
               "\"data\":[\"abc\",\"\",\"a\\u0000b\",\"\xc3\xa9\xf0\x9f\x98\x80 q\\\"\\\\/\\n\\u001f\x7f\"]");
}

static void test_float_text(void)
{
    float f = 0.1f;
    char *s = encode_values(OI_TYPE_FP32, &f, 4, 1);
    CHECKF(s && strcmp(s, "0.1") == 0, "0.1f printed as %s", s);
    free(s);
    double third = 1.0 / 3;
    s = encode_values(OI_TYPE_FP64, &third, 8, 1);
    CHECKF(s && strcmp(s, "0.3333333333333333") == 0, "1/3 printed as %s", s);
    free(s);
    float fthird = 1.0f / 3;
    s = encode_values(OI_TYPE_FP32, &fthird, 4, 1);
    CHECKF(s && strcmp(s, "0.33333334") == 0, "1/3f printed as %s", s);
    free(s);
    uint16_t halves[] = {0x7bff, 0x0001, 0x0002, 0x03ff, 0x0400, 0x3c00, 0x2e66, 0x7c00, 0xfc00, 0x7e00};
    s = encode_values(OI_TYPE_FP16, halves, sizeof(halves), 10);
    CHECKF(s && strcmp(s, "65500.0,6e-08,1e-07,6.1e-05,6.104e-05,1.0,0.1,Infinity,-Infinity,NaN") == 0,
           "FP16 printed as %s", s);
    free(s);
    uint16_t bf[] = {0x3dcd, 0x7f7f, 0x0001, 0x4049};
    s = encode_values(OI_TYPE_BF16, bf, sizeof(bf), 4);
    CHECKF(s && strcmp(s, "0.1,3.39e+38,9e-41,3.14") == 0, "BF16 printed as %s", s);
    free(s);
    double d[] = {1e22, 1e15, 123456789012345680.0, 0.0001, 0.00001, 2.5e-308, 100.0, 1e-7};
    s = encode_values(OI_TYPE_FP64, d, sizeof(d), 8);
    CHECKF(s && strcmp(s, "1e+22,1000000000000000.0,1.2345678901234568e+17,0.0001,1e-05,2.5e-308,100.0,1e-07") == 0,
           "FP64 printed as %s", s);
    free(s);
    float fl[] = {16777216.0f, 16777218.0f, 1e10f, 3.0e-39f, -0.0f};
    s = encode_values(OI_TYPE_FP32, fl, sizeof(fl), 5);
    CHECKF(s && strcmp(s, "16777216.0,16777218.0,10000000000.0,3e-39,-0.0") == 0, "FP32 printed as %s", s);
    free(s);
}

static void test_float_rounding(void)
{
    /* FP16 has 10 fraction bits: 1 + 2^-11 is halfway between 1 and 1 + 2^-10. */
    CHECK(fp16_of("1.0009765625") == 0x3c01);
    CHECK(fp16_of("1.00048828125") == 0x3c00);      /* tie: to even */
    CHECK(fp16_of("1.00146484375") == 0x3c02);      /* tie: to even, upwards */
    CHECK(fp16_of("1.000488281250001") == 0x3c01);  /* just above the tie: rounding through
                                                       float to nearest would give 0x3c00 */
    CHECK(fp16_of("1.0004882812499999") == 0x3c00);
    CHECK(fp16_of("65504") == 0x7bff);
    CHECK(fp16_of("65519") == 0x7bff);
    CHECK(fp16_of("-65504") == 0xfbff);
    CHECK(fp16_of("1e-7") == 0x0002);               /* subnormal */
    CHECK(fp16_of("5.960464477539063e-8") == 0x0001);
    CHECK(fp16_of("2.98023223876953125e-8") == 0x0000); /* half the smallest subnormal: tie to 0 */
    CHECK(fp16_of("2.9802323e-8") == 0x0001);
    /* Elements are read as the nearest double first, as numpy's float16(float(text)) does:
     * a 17-digit text whose double is the tie itself rounds as the tie. */
    CHECK(fp16_of("2.9802322387695313e-8") == 0x0000);
    CHECK(fp16_of("1e-8") == 0x0000);
    CHECK(fp16_of("6.103515625e-05") == 0x0400);
    CHECK((fp16_of("NaN") & 0x7fff) > 0x7c00);
    CHECK(fp16_of("-Infinity") == 0xfc00);
    CHECK(bf16_of("1.00390625") == 0x3f80);          /* tie: to even */
    CHECK(bf16_of("1.003906250000001") == 0x3f81);
    CHECK(bf16_of("1.01171875") == 0x3f82);          /* tie between 0x3f81 and 0x3f82: even */
    CHECK(bf16_of("3.3895313892515355e38") == 0x7f7f);
    CHECK(bf16_of("1e-40") == 0x0001);
    /* FP32 takes strtof for long tokens: a double-rounding case must still be right. */
    EXPECT_BYTES("FP32", "[1]", "[1.0000000596046447753906250000000001]", "\1\0\x80\x3f", 4);
    EXPECT_BYTES("FP32", "[1]", "[1.000000059604644775390625]", "\0\0\x80\x3f", 4);
    /* Long mantissas and large exponents leave the fast path. */
    static const double d[] = {1e23, 8.589973e9, 2.2250738585072011e-308, 0.1};
    EXPECT_BYTES("FP64", "[4]", "[1e23,8.589973e9,2.2250738585072011e-308,0.1000000000000000000000000001]",
                 d, 32);
    static const double z[] = {0.0, 0.0};
    EXPECT_BYTES("FP64", "[2]", "[0e999999999999,1e-99999]", z, 16);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Encodes many values of a float type, decodes the text back and compares the bits: every
 * FP16 and BF16 value, and random FP32 and FP64 bit patterns. */
static void round_trip_floats(oi_dtype_t dtype, size_t esize, int64_t count)
{
    char *vals = malloc((size_t)count * esize);
    for (int64_t i = 0; i < count; i++) {
        uint64_t v = esize == 2 ? (uint64_t)i : rng();
        memcpy(vals + i * (int64_t)esize, &v, esize);
    }
    char *text = encode_values(dtype, vals, (size_t)count * esize, count);
    CHECK(text != NULL);
    if (text == NULL) {
        free(vals);
        return;
    }
    size_t cap = strlen(text) + 256;
    char *json = malloc(cap);
    snprintf(json, cap, "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"%s\",\"shape\":[%" PRId64 "],\"data\":[%s]}]}",
             oi_dtype_name(dtype), count, text);
    decoded_t d;
    decode(&d, json);
    CHECKF(d.st == NULL, "%s decode: %s", oi_dtype_name(dtype), d.st ? d.st->message : "");
    int bad = 0;
    for (int64_t i = 0; d.st == NULL && i < count && bad < 5; i++) {
        uint64_t a = 0, b = 0;
        memcpy(&a, vals + i * (int64_t)esize, esize);
        memcpy(&b, d.req.inputs[0].data + i * (int64_t)esize, esize);
        double x = dtype == OI_TYPE_FP16 ? oi_half_to_float((uint16_t)a)
                   : dtype == OI_TYPE_BF16 ? oi_bf16_to_float((uint16_t)a)
                   : dtype == OI_TYPE_FP32 ? (double)((union { uint32_t u; float f; }){(uint32_t)a}.f)
                                          : ((union { uint64_t u; double f; }){a}.f);
        if (a != b && !isnan(x)) {
            bad++;
            CHECKF(0, "%s element %" PRId64 ": %#" PRIx64 " came back as %#" PRIx64,
                   oi_dtype_name(dtype), i, a, b);
        }
    }
    CHECK(bad == 0);
    release(&d);
    free(json);
    free(text);
    free(vals);
}

static void test_shapes_and_nesting(void)
{
    static const int32_t v[] = {1, 2, 3, 4};
    EXPECT_BYTES("INT32", "[2,2]", "[[1,2],[3,4]]", v, 16);
    EXPECT_BYTES("INT32", "[2,2]", "[1,2,3,4]", v, 16);
    EXPECT_BYTES("INT32", "[2,1,2]", "[[[1,2]],[[3,4]]]", v, 16);
    EXPECT_BYTES("INT32", "[]", "1", v, 4);
    EXPECT_BYTES("INT32", "[1]", " 1 ", v, 4);
    EXPECT_BYTES("INT32", "[1,1]", "[[1]]", v, 4);
    EXPECT_BYTES("INT32", "[0]", "[]", v, 0);
    EXPECT_BYTES("INT32", "[2,0]", "[[],[]]", v, 0);
    EXPECT_BYTES("BYTES", "[0]", "[]", "", 0);
    EXPECT_BYTES("BYTES", "[]", "\"a\"", "\1\0\0\0a", 5);
    EXPECT_BYTES("BOOL", "[1]", "false", "\0", 1);
    EXPECT_BYTES("INT32", "[ 2 , 2 ]", " [ [ 1 , 2 ] ,\n\t[ 3 , 4 ] ] ", v, 16);

    /* Data before the datatype and shape is parsed once the input object closes. */
    ROUND_TRIP("{\"inputs\":[{\"data\":[[1,2],[3,4]],\"name\":\"x\",\"shape\":[2,2],\"datatype\":\"INT16\"}]}",
               "\"data\":[1,2,3,4]");
    EXPECT_ERROR("{\"inputs\":[{\"data\":[[1,2],[3]],\"name\":\"x\",\"shape\":[3],\"datatype\":\"INT16\"}]}",
                 "input 'x': nested data does not match shape [3]: an array at depth 2, deeper than the shape");

    ROUND_TRIP("{\"outputs\":[{\"name\":\"o\"}],\"inputs\":[{\"data\":[\"a\\nb\",\"\\u00e9\"],\"shape\":[2],\"name\":\"s\",\"datatype\":\"BYTES\"}]}",
               "\"data\":[\"a\\nb\",\"\xc3\xa9\"]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"data\":[1.5],\"datatype\":\"FP32\",\"shape\":[1]}]}",
               "\"data\":[1.5]");
    EXPECT_ERROR("{\"inputs\":[{\"data\":[1,2],\"name\":\"x\",\"shape\":[3],\"datatype\":\"INT16\"}]}",
                 "input 'x': expected 3 elements for shape [3], got 2");
    EXPECT_ERROR("{\"inputs\":[{\"data\":[1,\"a\"],\"name\":\"x\",\"shape\":[2],\"datatype\":\"INT16\"}]}",
                 "input 'x': element 1: expected a number for INT16, got string");

    /* Nesting: default limit 64 counts the top object, "inputs", the input and the value of an
     * unknown key (data cannot nest deeper than its shape). */
    char json[2048];
    char open[200], close[200];
    for (int depth = 61; depth <= 62; depth++) {
        memset(open, '[', (size_t)depth);
        open[depth] = '\0';
        memset(close, ']', (size_t)depth);
        close[depth] = '\0';
        snprintf(json, sizeof(json),
                 "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[1],\"z\":%s1%s}]}", open,
                 close);
        decoded_t d;
        decode(&d, json);
        if (depth == 61)
            CHECKF(d.st == NULL, "depth 64 rejected: %s", d.st ? d.st->message : "");
        else
            CHECKF(d.st && strstr(d.st->message, "JSON nesting depth exceeds maximum allowed limit (64)"),
                   "depth 65 not rejected: %s", d.st ? d.st->message : "accepted");
        release(&d);
    }
    expect_error(__LINE__, json, strlen(json), NULL, 0, 10, "maximum allowed limit (10)");
    decoded_t d;
    decode_raw(&d, json, strlen(json), NULL, 0, 100);
    CHECKF(d.st == NULL, "depth 65 with a limit of 100: %s", d.st ? d.st->message : "");
    release(&d);
    memset(open, '[', 64);
    open[64] = '\0';
    memset(close, ']', 64);
    close[64] = '\0';
    snprintf(json, sizeof(json), "{\"x\":%s%s,\"inputs\":[]}", open, close);
    EXPECT_ERROR(json, "JSON nesting depth exceeds maximum allowed limit (64)");
    snprintf(json, sizeof(json), "{\"parameters\":{\"a\":%s%s},\"inputs\":[]}", open, close);
    EXPECT_ERROR(json, "nesting depth exceeds");
    /* Far deeper than any limit: still a clean error (the skipper recurses at most the cap). */
    char *deep = malloc(200020);
    if (deep == NULL)
        return;
    memcpy(deep, "{\"a\":", 5);
    memset(deep + 5, '[', 200000);
    memcpy(deep + 200005, "}", 2);
    expect_error(__LINE__, deep, strlen(deep), NULL, 0, 4000000000u, "maximum allowed limit (1024)");
    free(deep);
}

static void test_request_fields(void)
{
    const char *json =
        "{\"id\":\"a\\\"b\\\\c\\u00e9\\ud83d\\ude00\\n\",\"model_name\":{\"x\":[1,{}]},"
        "\"parameters\":{\"binary_data_output\":true,\"k\":\"v\\n\",\"n\":1.5},"
        "\"inputs\":[{\"name\":\"in\\u0030\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[5],"
        "\"parameters\":{\"a\":[1,2],\"bin\\u0061ry\":false},\"extra\":null}],"
        "\"outputs\":[{\"name\":\"o1\",\"parameters\":{\"binary_data\":false,\"top\":3}},{\"name\":\"o2\",\"x\":1},"
        "{\"name\":\"o3\",\"parameters\":{\"binary_data\":true}}]}";
    decoded_t d;
    decode(&d, json);
    CHECKF(d.st == NULL, "decode: %s", d.st ? d.st->message : "");
    if (d.st != NULL) {
        release(&d);
        return;
    }
    oi_request_t *r = &d.req;
    CHECK(r->body == d.body && atomic_load(&d.body->refs) == 2);
    CHECK(r->id_len == 12 && memcmp(r->id, "a\"b\\c\xc3\xa9\xf0\x9f\x98\x80\n", 12) == 0 &&
          r->id[12] == '\0');
    CHECK(r->binary_data_output == 1);
    const char *params = "{\"binary_data_output\":true,\"k\":\"v\\n\",\"n\":1.5}";
    CHECK(r->parameters.len == strlen(params) && memcmp(r->parameters.ptr, params, r->parameters.len) == 0);
    CHECK(r->n_inputs == 1 && strcmp(r->inputs[0].name, "in0") == 0);
    const char *iparams = "{\"a\":[1,2],\"bin\\u0061ry\":false}";
    CHECK(r->inputs[0].parameters.len == strlen(iparams) &&
          memcmp(r->inputs[0].parameters.ptr, iparams, strlen(iparams)) == 0);
    CHECK(r->n_outputs == 3 && strcmp(r->outputs[1].name, "o2") == 0);
    CHECK(r->outputs[0].binary_data == 0 && r->outputs[1].binary_data == -1 && r->outputs[2].binary_data == 1);
    CHECK(r->outputs[1].parameters.ptr == NULL);
    CHECK(r->outputs[0].parameters.len == strlen("{\"binary_data\":false,\"top\":3}"));
    CHECK(oi_json_output_is_binary(r, "o1") == 0);
    CHECK(oi_json_output_is_binary(r, "o2") == 1);
    CHECK(oi_json_output_is_binary(r, "o3") == 1);
    CHECK(oi_json_output_is_binary(r, "other") == 1);
    r->binary_data_output = -1;
    CHECK(oi_json_output_is_binary(r, "o2") == 0);
    CHECK(oi_json_output_is_binary(r, "o3") == 1);

    oi_status_t *st;
    char *out = echo(r, NULL, "7", &st);
    CHECKF(out && strcmp(out, "{\"model_name\":\"m\",\"model_version\":\"7\",\"id\":\"a\\\"b\\\\c\xc3\xa9\xf0\x9f\x98\x80\\n\","
                              "\"outputs\":[{\"name\":\"in0\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[5]}]}") == 0,
           "response %s", out);
    free(out);
    uint8_t bin[] = {1};
    out = echo(r, bin, NULL, &st);
    CHECKF(out && strcmp(out, "{\"model_name\":\"m\",\"id\":\"a\\\"b\\\\c\xc3\xa9\xf0\x9f\x98\x80\\n\","
                              "\"outputs\":[{\"name\":\"in0\",\"datatype\":\"INT8\",\"shape\":[1],"
                              "\"parameters\":{\"binary_data_size\":1}}]}") == 0,
           "binary response %s", out);
    free(out);
    release(&d);

    /* Keys may be escaped; unknown ones are skipped whatever they hold. */
    decode(&d, "{\"\\u0069nputs\":[{\"n\\u0061me\":\"x\",\"shape\":[1],\"datatype\":\"\\u0049NT8\",\"data\":[1],"
               "\"parameters\":{\"binary_data_siz\\u0065\":-0}}]}");
    CHECKF(d.st && strstr(d.st->message, "got both"), "escaped keys: %s", d.st ? d.st->message : "ok");
    release(&d);
    decode(&d, "{\"\\u0069nputs\":[{\"n\\u0061me\":\"x\",\"shape\":[1],\"datatype\":\"\\u0049NT8\",\"data\":[1]}],"
               "\"z\":[true,false,null,-1.5e3,\"s\",{\"a\":{}}],\"NaN\":0}");
    CHECKF(d.st == NULL && d.req.inputs[0].dtype == OI_TYPE_INT8, "escaped keys: %s", d.st ? d.st->message : "");
    release(&d);
    decode(&d, "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}],\"outputs\":[]}");
    CHECK(d.st == NULL && d.req.n_outputs == 0 && d.req.id == NULL && d.req.binary_data_output == -1);
    out = d.st == NULL ? echo(&d.req, NULL, "1", &st) : NULL;
    const char *head = "{\"model_name\":\"m\",\"model_version\":\"1\",\"outputs\":[{";
    CHECKF(out && strncmp(out, head, strlen(head)) == 0, "%s", out);
    free(out);
    release(&d);
}

static void test_binary_inputs(void)
{
    const char *json =
        "{\"inputs\":[{\"name\":\"a\",\"shape\":[2],\"datatype\":\"INT32\",\"parameters\":{\"binary_data_size\":8}},"
        "{\"name\":\"e\",\"shape\":[0],\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":0}},"
        "{\"name\":\"j\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[9]},"
        "{\"parameters\":{\"binary_data_size\":11},\"name\":\"s\",\"shape\":[2],\"datatype\":\"BYTES\"}]}";
    const char tail[] = "\1\0\0\0\2\0\0\0" "\3\0\0\0abc\0\0\0\0";
    decoded_t d;
    decode_raw(&d, json, strlen(json), tail, 19, 0);
    CHECKF(d.st == NULL, "binary decode: %s", d.st ? d.st->message : "");
    if (d.st == NULL) {
        oi_tensor_t *in = d.req.inputs;
        size_t j = strlen(json);
        CHECK(in[0].data == d.body->data + j && in[0].byte_size == 8 && in[0].owner == d.body);
        CHECK(in[1].data == d.body->data + j + 8 && in[1].byte_size == 0);
        CHECK(in[2].owner != d.body && in[2].byte_size == 1 && in[2].data[0] == 9);
        CHECK(in[3].data == d.body->data + j + 8 && in[3].byte_size == 11);
        CHECK(atomic_load(&d.body->refs) == 5); /* ours, the request's, a's, e's and s's */
        oi_status_t *st;
        uint8_t bin[] = {1, 0, 0, 0};
        char *out = echo(&d.req, bin, NULL, &st);
        CHECKF(out && strstr(out, "\"name\":\"a\",\"datatype\":\"INT32\",\"shape\":[2],\"parameters\":{\"binary_data_size\":8}}") &&
                   strstr(out, "\"shape\":[0],\"data\":[]}") && strstr(out, "\"data\":[\"abc\",\"\"]"),
               "%s", out);
        free(out);
    }
    release(&d);
    const char more[] = "\1\0\0\0\2\0\0\0\3\0\0\0abc\0\0\0\0\0";
    expect_error(__LINE__, json, strlen(json), more, 20, 0,
                 "binary data: 20 bytes follow the JSON but the inputs' binary_data_size add up to 19");
    expect_error(__LINE__, json, strlen(json), tail, 18, 0,
                 "input 's': binary_data_size is 11 but only 10 bytes of binary data remain");
    /* An input's byte size, and a BYTES input's elements, are checked once the model is known
     * (validate.c), in Triton's words: the decoder passes them on. */
    const char *one = "{\"inputs\":[{\"name\":\"a\",\"shape\":[2],\"datatype\":\"INT32\",\"parameters\":{\"binary_data_size\":7}}]}";
    expect_passed_on(__LINE__, one, tail, 7, oi_tensor_check_input_size,
                     "[request id: r1] input byte size mismatch for input 'a' for model 'm'. Expected 8, got 7");
    const char *bytes = "{\"inputs\":[{\"name\":\"b\",\"shape\":[2],\"datatype\":\"BYTES\",\"parameters\":{\"binary_data_size\":7}}]}";
    expect_passed_on(__LINE__, bytes, tail + 8, 7, oi_tensor_check_bytes,
                     "[request id: r1] expected 2 string elements for inference input 'b' for model 'm', got 1");
    const char *plain = "{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}]}";
    expect_error(__LINE__, plain, strlen(plain), "x", 1, 0, "1 bytes follow the JSON but the inputs' binary_data_size add up to 0");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"parameters\":{\"binary_data_size\":0},\"data\":[1]}]}",
                 "input 'a': expected either \"data\" or parameters.binary_data_size, got both");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1],\"parameters\":{\"binary_data_size\":1}}]}",
                 "got both");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"parameters\":{\"binary_data_size\":-1}}]}",
                 "inputs[0].parameters.binary_data_size: expected a non-negative integer, got -1");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"parameters\":{\"binary_data_size\":\"4\"}}]}",
                 "inputs[0].parameters.binary_data_size: expected a non-negative integer, got string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}],\"parameters\":{\"binary_data_output\":1}}",
                 "parameters.binary_data_output: expected a boolean, got number");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}],\"outputs\":[{\"name\":\"o\",\"parameters\":{\"binary_data\":\"yes\"}}]}",
                 "outputs[0].parameters.binary_data: expected a boolean, got string");
}

#define IN(rest) "{\"inputs\":[{\"name\":\"INPUT0\"," rest "}]}"

static void test_errors(void)
{
    /* Structure and required fields. */
    EXPECT_ERROR("{\"id\":\"x\"}", "field 'inputs' is required");
    EXPECT_ERROR("{\"inputs\":[]}", "inputs: expected at least one input, got an empty array");
    EXPECT_ERROR("{\"inputs\":{}}", "inputs: expected an array of input objects, got object");
    EXPECT_ERROR("{\"inputs\":[1]}", "inputs[0]: expected an object, got number");
    EXPECT_ERROR("[1]", "request body: expected a JSON object, got array");
    EXPECT_ERROR("", "request body: expected a JSON object, got nothing");
    EXPECT_ERROR("   ", "request body: expected a JSON object, got end of input");
    EXPECT_ERROR("{\"id\":5,\"inputs\":[]}", "id: expected a string, got number");
    EXPECT_ERROR("{\"id\":\"a\" \"inputs\":[]}", "malformed JSON at byte 10: expected ',' or '}', got '\"'");
    EXPECT_ERROR("{\"id\":\"a\",}", "malformed JSON at byte 10: expected a string key, got '}'");
    EXPECT_ERROR("{\"id\" \"a\"}", "expected ':'");
    EXPECT_ERROR("{\"id\":\"a\",\"id\":\"b\",\"inputs\":[]}", "duplicate key 'id'");
    EXPECT_ERROR("{\"parameters\":[],\"inputs\":[]}", "parameters: expected an object, got array");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}]} x",
                 "unexpected data after the top-level object");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}]}{}",
                 "unexpected data after the top-level object");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}]", "end of input");
    EXPECT_ERROR("{\"inputs\":[{\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}]}", "inputs[0]: field 'name' is required");
    EXPECT_ERROR(IN("\"datatype\":\"INT8\",\"data\":[1]"), "input 'INPUT0': field 'shape' is required");
    EXPECT_ERROR(IN("\"shape\":[1],\"data\":[1]"), "input 'INPUT0': field 'datatype' is required");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT8\""), "input 'INPUT0': field 'data' is required");
    EXPECT_ERROR(IN("\"shape\":[1],\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]"), "inputs[0]: duplicate key 'shape'");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1],\"data\":[2]"), "inputs[0]: duplicate key 'data'");
    EXPECT_ERROR("{\"inputs\":[{\"name\":7}]}", "inputs[0].name: expected a string, got number");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\\u0000b\"}]}", "inputs[0].name: expected a name without \\u0000");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]},"
                 "{\"name\":\"b\",\"shape\":\"2\",\"datatype\":\"INT8\",\"data\":[1]}]}",
                 "inputs[1].shape: expected an array of non-negative integers, got string");
    /* A negative or fractional dimension: tritonserver's words and its 500. */
    EXPECT_INTERNAL(IN("\"shape\":[-1],\"datatype\":\"INT8\",\"data\":[1]"),
                    "Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer");
    EXPECT_INTERNAL(IN("\"shape\":[1.5],\"datatype\":\"INT8\",\"data\":[1]"), "non-unsigned-integer");
    EXPECT_INTERNAL(IN("\"shape\":[1e2],\"datatype\":\"INT8\",\"data\":[1]"), "non-unsigned-integer");
    EXPECT_ERROR(IN("\"shape\":[null],\"datatype\":\"INT8\",\"data\":[1]"), "non-negative integers, got null");
    EXPECT_ERROR(IN("\"shape\":[9223372036854775808],\"datatype\":\"INT8\",\"data\":[1]"),
                 "non-negative integers, got 9223372036854775808");
    EXPECT_ERROR(IN("\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],\"datatype\":\"INT8\",\"data\":[1]"),
                 "inputs[0].shape: expected at most 16 dimensions");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP8\",\"data\":[1]"),
                 "inputs[0].datatype: expected one of BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, "
                 "INT32, INT64, FP16, FP32, FP64, BF16, BYTES, got \"FP8\"");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"int8\",\"data\":[1]"), "got \"int8\"");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":8,\"data\":[1]"), "inputs[0].datatype: expected a string, got number");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1],\"parameters\":3"),
                 "inputs[0].parameters: expected an object, got number");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"INPUT0\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]},"
                 "{\"name\":\"INPUT0\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[2]}]}",
                 "[request id: <id_unknown>] input 'INPUT0' already exists in request");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}],"
                 "\"outputs\":[{\"name\":\"OUTPUT0\"},{\"name\":\"x\"},{\"name\":\"OUTPUT0\"}]}",
                 "[request id: <id_unknown>] output 'OUTPUT0' already exists in request");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}],\"outputs\":[{}]}",
                 "outputs[0]: field 'name' is required");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}],\"outputs\":[\"o\"]}",
                 "outputs[0]: expected an object, got string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}],\"outputs\":{}}",
                 "outputs: expected an array of output objects, got object");

    /* Element counts and values. */
    EXPECT_ERROR(IN("\"shape\":[2,16],\"datatype\":\"INT32\",\"data\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,"
                    "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]"),
                 "input 'INPUT0': expected 32 elements for shape [2,16], got 31");
    EXPECT_ERROR(IN("\"shape\":[2],\"datatype\":\"INT32\",\"data\":[1,2,3]"),
                 "input 'INPUT0': expected 2 elements for shape [2], got 3");
    EXPECT_ERROR(IN("\"shape\":[2],\"datatype\":\"INT32\",\"data\":5"), "expected 2 elements for shape [2], got 1");
    /* Nested data follows the shape at every level; flat data is always accepted. */
    EXPECT_ERROR(IN("\"shape\":[4],\"datatype\":\"INT32\",\"data\":[[1],[2,[3]],[],4]"),
                 "an array at depth 2, deeper than the shape");
    EXPECT_ERROR(
        IN("\"shape\":[1,16],\"datatype\":\"INT32\",\"data\":[[1,2],[3],[4,5,6,7,8,9,10,11,12,13,14,15,16]]"),
        "input 'INPUT0': nested data does not match shape [1,16]: an array at depth 2 has 2 elements, expected 16");
    EXPECT_ERROR(IN("\"shape\":[2,2],\"datatype\":\"INT32\",\"data\":[[1,2],[3,4],[5,6]]"),
                 "an array at depth 1 has 3 elements, expected 2");
    EXPECT_ERROR(IN("\"shape\":[2,2],\"datatype\":\"INT32\",\"data\":[[1,2],3,4]"),
                 "a value at depth 1, expected arrays down to depth 2");
    EXPECT_ERROR(IN("\"shape\":[2,2],\"datatype\":\"INT32\",\"data\":[1,2,[3,4]]"), "an array at depth 2 among values");
    EXPECT_ERROR(IN("\"shape\":[2,2],\"datatype\":\"INT32\",\"data\":[[],[1,2,3,4]]"),
                 "an array at depth 2 has 0 elements, expected 2");
    EXPECT_ERROR(IN("\"shape\":[4],\"datatype\":\"UINT8\",\"data\":[0,1,2,300]"),
                 "input 'INPUT0': element 3: 300 is out of range for UINT8");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"UINT8\",\"data\":[-1]"), "element 0: -1 is out of range for UINT8");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT8\",\"data\":[-129]"), "-129 is out of range for INT8");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT8\",\"data\":[128]"), "128 is out of range for INT8");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT16\",\"data\":[32768]"), "32768 is out of range for INT16");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"UINT32\",\"data\":[4294967296]"), "out of range for UINT32");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT64\",\"data\":[9223372036854775808]"),
                 "9223372036854775808 is out of range for INT64");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT64\",\"data\":[-9223372036854775809]"),
                 "-9223372036854775809 is out of range for INT64");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"UINT64\",\"data\":[18446744073709551616]"),
                 "18446744073709551616 is out of range for UINT64");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"UINT64\",\"data\":[-1]"), "-1 is out of range for UINT64");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT32\",\"data\":[1.5]"),
                 "input 'INPUT0': element 0: expected an integer for INT32, got 1.5");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT32\",\"data\":[1e2]"), "expected an integer for INT32, got 1e2");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT32\",\"data\":[1.0]"), "expected an integer for INT32, got 1.0");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT32\",\"data\":[NaN]"), "expected an integer for INT32, got NaN");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT32\",\"data\":[\"1\"]"),
                 "input 'INPUT0': element 0: expected a number for INT32, got string");
    EXPECT_ERROR(IN("\"shape\":[2],\"datatype\":\"FP32\",\"data\":[1,null]"), "element 1: expected a number for FP32, got null");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP32\",\"data\":[{}]"), "expected a number for FP32, got object");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP32\",\"data\":[true]"), "expected a number for FP32, got boolean");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"BOOL\",\"data\":[1]"), "expected true or false for BOOL, got number");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[1]"), "expected a string for BYTES, got number");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1e39]"), "element 0: 1e39 is out of range for FP32");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP64\",\"data\":[-1e309]"), "-1e309 is out of range for FP64");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP16\",\"data\":[65520]"), "65520 is out of range for FP16");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"BF16\",\"data\":[3.4e38]"), "out of range for BF16");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP32\",\"data\":[-NaN]"), "expected a value");
    /* NaN and the infinities are tensor elements only: elsewhere the JSON must be RFC 8259's. */
    EXPECT_ERROR("{\"parameters\":{\"t\":NaN},\"inputs\":[]}",
                 "NaN is not a JSON number; NaN, Infinity and -Infinity are accepted only as elements of FP16, FP32, "
                 "FP64 and BF16 tensor data");
    EXPECT_ERROR("{\"x\":[1,-Infinity],\"inputs\":[]}", "-Infinity is not a JSON number");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP32\",\"data\":[nan]"), "expected a number for FP32, got malformed JSON");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP32\",\"data\":[inf]"), "expected a value, got 'i'");
    EXPECT_ERROR(IN("\"shape\":[2],\"datatype\":\"FP32\",\"data\":[1,]"), "expected a value, got ']'");
    EXPECT_ERROR(IN("\"shape\":[2],\"datatype\":\"FP32\",\"data\":[1 2]"), "expected ',' or ']', got '2'");

    /* Huge shapes are refused before anything is allocated for them. */
    EXPECT_ERROR(IN("\"shape\":[1000000,1000000],\"datatype\":\"FP64\",\"data\":[1]"),
                 "input 'INPUT0': shape [1000000,1000000] has 1000000000000 elements but the request body has only");
    EXPECT_ERROR(IN("\"datatype\":\"BYTES\",\"data\":[],\"shape\":[576460752303423488]"),
                 "elements but the request body has only");
    /* ... and so are shapes that no array could have, even when a zero dimension leaves them empty. */
    EXPECT_ERROR(IN("\"shape\":[0,4611686018427387904],\"datatype\":\"FP32\",\"data\":[]"),
                 "input 'INPUT0': shape [0,4611686018427387904] has too many elements");
    EXPECT_BYTES("FP32", "[0,1099511627776]", "[]", "", 0);
    /* tritonserver's words for an element count or byte size past INT64_MAX. */
    EXPECT_ERROR(IN("\"shape\":[9223372036854775807,2],\"datatype\":\"INT8\",\"data\":[1]"),
                 "invalid shape for input 'INPUT0': shape [9223372036854775807,2] causes total element count to "
                 "exceed maximum size of 9223372036854775807");
    EXPECT_ERROR(IN("\"shape\":[4,1152921504606846978],\"datatype\":\"FP32\",\"data\":[1]"),
                 "byte size overflow for input 'INPUT0': element count (4611686018427387912) * data type size (4) "
                 "exceeds maximum allowed size (9223372036854775807)");

    /* Numbers. */
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"INT8\",\"data\":[01]"), "leading zeros are not allowed");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1.]"), "expected a digit after '.'");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP32\",\"data\":[.5]"), "expected a value, got '.'");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1e]"), "expected a digit in the exponent");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP32\",\"data\":[-]"), "expected a digit, got ']'");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"FP32\",\"data\":[+1]"), "expected a value, got '+'");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":1", "unexpected end of input");

    /* Strings. */
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\xff\"}]}", "malformed JSON at byte 21: invalid UTF-8 in string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"\xc0\x80\"}]}", "invalid UTF-8 in string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"\xed\xa0\x80\"}]}", "invalid UTF-8 in string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"\xf4\x90\x80\x80\"}]}", "invalid UTF-8 in string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"\xe2\x82\"}]}", "invalid UTF-8 in string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"\\uD800\"}]}", "lone UTF-16 surrogate escape in string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"\\uDC00\\uD800\"}]}", "lone UTF-16 surrogate");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"\\uD800\\u0041\"}]}", "lone UTF-16 surrogate");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"\\uD800\\", "lone UTF-16 surrogate");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"\\", "unterminated string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"\\u12G4\"}]}", "expected 4 hex digits after \\u");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"\\x\"}]}", "invalid escape in string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\nb\"}]}", "unescaped control character 0x0a in string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\tb\"}]}", "unescaped control character 0x09 in string");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"ab", "unterminated string");
    EXPECT_ERROR("{\"x\":\"\xff\",\"inputs\":[]}", "invalid UTF-8 in string");
    EXPECT_ERROR(IN("\"shape\":[1],\"datatype\":\"BYTES\",\"data\":[\"\\uDE00\"]"), "lone UTF-16 surrogate");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"shape\":[1],\"datatype\":\"INT8\",\"data\":[1]}],\"x\":tru}", "expected 'true'");
    char nul[] = "{\"inputs\":[{\"name\":\"a\0\"}]}";
    expect_error(__LINE__, nul, sizeof(nul) - 1, NULL, 0, 0, "unescaped control character 0x00");

    /* A JSON length (from Inference-Header-Content-Length) past the end of the body. */
    oi_buf_t *body = oi_buf_new(4);
    memcpy(body->data, "{}{}", 4);
    body->len = 4;
    oi_request_t req = {.binary_data_output = -1};
    oi_status_t *st = oi_json_decode_infer_request(body, 5, &req, NULL);
    CHECKF(st && st->code == OI_BAD_REQUEST && strstr(st->message, "JSON header length 5 exceeds the request body (4 bytes)"),
           "%s", st ? st->message : "accepted");
    CHECK(request_is_clear(&req));
    oi_status_free(st);
    oi_buf_unref(body);
}

/* Every prefix of a valid body is an error, never a crash or a leak. */
static void test_truncations(void)
{
    const char *json =
        "{\"id\":\"r\\u00e9\",\"parameters\":{\"binary_data_output\":false},\"inputs\":[{\"name\":\"a\","
        "\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[[1.5,-2e-3],[NaN,-Infinity]]},{\"data\":[\"x\\ny\"],"
        "\"name\":\"b\",\"shape\":[1],\"datatype\":\"BYTES\"}],\"outputs\":[{\"name\":\"o\",\"parameters\":{\"binary_data\":true}}]}";
    size_t n = strlen(json);
    int errors = 0;
    for (size_t k = 0; k < n; k++) {
        decoded_t d;
        decode_raw(&d, json, k, NULL, 0, 0);
        errors += d.st != NULL && request_is_clear(&d.req);
        release(&d);
    }
    CHECKF(errors == (int)n, "%d of %zu truncations failed cleanly", errors, n);
    decoded_t d;
    decode(&d, json);
    CHECKF(d.st == NULL, "full body: %s", d.st ? d.st->message : "");
    release(&d);
}

static void test_encode(void)
{
    oi_sbuf_t out = {0};
    CHECK(oi_json_encode_error(&out, "bad \"x\"\n\x01 \xff!") == 0);
    oi_sbuf_append(&out, "", 1);
    CHECKF(strcmp(out.data, "{\"error\":\"bad \\\"x\\\"\\n\\u0001 \xef\xbf\xbd!\"}") == 0, "%s", out.data);
    oi_sbuf_free(&out);
    CHECK(oi_json_write_string(&out, "\x7f/\xe2\x82\xac\xe2\x82", 7) == 0);
    CHECK(out.len == 13 && memcmp(out.data, "\"\x7f/\xe2\x82\xac\xef\xbf\xbd\xef\xbf\xbd\"", 13) == 0);
    oi_sbuf_free(&out);

    /* Errors leave `out` as it was. */
    oi_sbuf_append(&out, "prefix", 6);
    oi_buf_t *b = oi_buf_new(16);
    memcpy(b->data, "\2\0\0\0ok\2\0\0\0\xff\xfe", 12);
    b->len = 12;
    oi_tensor_t t[2] = {
        {.name = "fine", .dtype = OI_TYPE_INT8, .ndim = 1, .shape = {2}, .data = b->data, .byte_size = 2},
        {.name = "bin", .dtype = OI_TYPE_BYTES, .ndim = 1, .shape = {2}, .data = b->data, .byte_size = 12},
    };
    oi_response_t resp = {.outputs = t, .n_outputs = 2};
    oi_status_t *st = oi_json_encode_infer_response(&out, "m", NULL, NULL, &resp, NULL);
    CHECKF(st && st->code == OI_BAD_REQUEST &&
               strstr(st->message, "output 'bin': BYTES element 1 is not valid UTF-8") &&
               strstr(st->message, "binary_data"),
           "%s", st ? st->message : "ok");
    CHECK(out.len == 6);
    oi_status_free(st);
    uint8_t bin[] = {0, 1};
    st = oi_json_encode_infer_response(&out, "m", NULL, NULL, &resp, bin);
    CHECK(st == NULL);
    oi_sbuf_append(&out, "", 1);
    CHECKF(st == NULL && strcmp(out.data, "prefix{\"model_name\":\"m\",\"outputs\":[{\"name\":\"fine\",\"datatype\":\"INT8\","
                                          "\"shape\":[2],\"data\":[2,0]},{\"name\":\"bin\",\"datatype\":\"BYTES\",\"shape\":[2],"
                                          "\"parameters\":{\"binary_data_size\":12}}]}") == 0,
           "%s", out.data);
    out.len = 6;
    t[0].byte_size = 3;
    st = oi_json_encode_infer_response(&out, "m", NULL, NULL, &resp, bin);
    CHECKF(st && st->code == OI_INTERNAL && strstr(st->message, "output 'fine': shape [2] of INT8 needs 2 x 1 bytes, got 3"),
           "%s", st ? st->message : "ok");
    CHECK(out.len == 6);
    oi_status_free(st);
    oi_sbuf_free(&out);
    oi_buf_unref(b);

    /* Many elements cross the batch reservation boundary; the widest values fill it. */
    enum { N = 1000 };
    double *wide = malloc(N * sizeof(double));
    for (int i = 0; i < N; i++)
        wide[i] = -2.2250738585072014e-308 * (1 + i * 1e-9);
    char *s = encode_values(OI_TYPE_FP64, wide, N * sizeof(double), N);
    CHECK(s != NULL && strncmp(s, "-2.2250738585072014e-308,", 25) == 0);
    free(s);
    int64_t *ints = malloc(N * sizeof(int64_t));
    for (int i = 0; i < N; i++)
        ints[i] = INT64_MIN + i;
    s = encode_values(OI_TYPE_INT64, ints, N * sizeof(int64_t), N);
    CHECK(s != NULL && strncmp(s, "-9223372036854775808,-9223372036854775807,", 42) == 0);
    free(s);
    free(ints);
    free(wide);
}

/* Decimal text is the "C" locale's whatever the program's locale says. Significands past 19
 * digits take the exact path (strtod, strtof), where a ',' locale would stop at the '.'.
 * `name` is a locale with a decimal comma; failing to install it fails the test. */
static void test_locale(const char *name)
{
    if (setlocale(LC_NUMERIC, name) == NULL || strcmp(localeconv()->decimal_point, ",") != 0) {
        printf("FAIL: locale %s with a decimal comma cannot be installed\n", name);
        failed++;
        return;
    }
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP64\",\"shape\":[3],"
               "\"data\":[0.12345678901234567890,0.12345678901234567890123,2.5e-300]}]}",
               "\"data\":[0.12345678901234568,0.12345678901234568,2.5e-300]");
    ROUND_TRIP("{\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1],"
               "\"data\":[0.1234567890123456789012345]}]}",
               "\"data\":[0.12345679]");
    setlocale(LC_NUMERIC, "C");
}

/* Parameters compared member by member, the scheduler's own keys left out. */
static void test_params_same(void)
{
    static const char *const ignored[] = {"priority", "timeout", NULL};
#define SAME(a, b) oi_json_params_same((oi_slice_t){a, sizeof(a) - 1}, (oi_slice_t){b, sizeof(b) - 1}, ignored)
    CHECK(SAME("{}", "{}"));
    CHECK(SAME("{\"priority\":1}", "{}"));
    CHECK(SAME("{\"a\":1,\"priority\":1}", "{\"timeout\":5, \"a\" : 1}"));
    CHECK(SAME("{\"a\":{\"priority\":1}}", "{\"priority\":[1,2],\"a\":{\"priority\":1}}"));
    CHECK(!SAME("{\"a\":1}", "{\"a\":2}"));
    CHECK(!SAME("{\"a\":1}", "{\"a\":1,\"b\":1}"));
    CHECK(!SAME("{\"a\":1,\"b\":1}", "{\"b\":1,\"a\":1}"));
    CHECK(!SAME("{\"priority\":1", "{\"priority\":1"));
    CHECK(!SAME("{\"a\":1}x", "{\"a\":1}"));
#undef SAME
    CHECK(oi_json_params_same((oi_slice_t){NULL, 0}, (oi_slice_t){"{\"timeout\":1}", 13}, ignored));
    CHECK(!oi_json_params_same((oi_slice_t){NULL, 0}, (oi_slice_t){"{\"b\":1}", 7}, ignored));
}

/* The shared-memory extension: inputs that name a region carry no data; outputs written into
 * a region are encoded as metadata and parameters; oi_json_param reads parameters. */
static void test_shared_memory(void)
{
    decoded_t d;
    decode(&d, "{\"inputs\":[{\"name\":\"a\",\"datatype\":\"FP32\",\"shape\":[4],\"parameters\":"
               "{\"shared_memory_region\":\"r\\u00e9\",\"shared_memory_byte_size\":16,\"shared_memory_offset\":8}},"
               "{\"name\":\"b\",\"datatype\":\"INT8\",\"shape\":[1],\"data\":[1]}]}");
    CHECKF(d.st == NULL, "%s", d.st ? d.st->message : "");
    if (d.st == NULL) {
        const oi_tensor_t *a = &d.req.inputs[0];
        CHECK(a->shm == 1 && a->data == NULL && a->owner == NULL && a->byte_size == 0);
        CHECK(d.req.inputs[1].shm == 0 && d.req.inputs[1].byte_size == 1);
        char buf[16];
        oi_json_param_t v;
        CHECK(oi_json_param(a->parameters, "shared_memory_region", &v, buf, sizeof(buf)) == 0);
        CHECK(v.kind == OI_JSON_PARAM_STRING && v.len == 3 && strcmp(buf, "r\xc3\xa9") == 0 && !v.too_long);
        CHECK(oi_json_param(a->parameters, "shared_memory_byte_size", &v, buf, sizeof(buf)) == 0);
        CHECK(v.kind == OI_JSON_PARAM_COUNT && v.count == 16);
        CHECK(oi_json_param(a->parameters, "shared_memory_region", &v, buf, 2) == 0 && v.too_long);
        CHECK(oi_json_param(a->parameters, "nope", &v, buf, sizeof(buf)) == 0 && v.kind == OI_JSON_PARAM_ABSENT);
    }
    release(&d);
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"datatype\":\"FP32\",\"shape\":[1],\"data\":[1],"
                 "\"parameters\":{\"shared_memory_region\":\"r\"}}]}",
                 "got \"data\" and shared_memory_region");
    EXPECT_ERROR("{\"inputs\":[{\"name\":\"a\",\"datatype\":\"FP32\",\"shape\":[1],"
                 "\"parameters\":{\"binary_data_size\":4,\"shared_memory_region\":\"r\"}}]}",
                 "got binary_data_size and shared_memory_region");

    char buf[8];
    oi_json_param_t v;
    static const char *const bad[] = {"", "{", "{\"a\":}", "{\"a\":1,}", "[1]", "{\"a\":1} x", "{\"a\":\"\\q\"}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        oi_slice_t sl = {bad[i], strlen(bad[i])};
        CHECKF(oi_json_param(sl, "a", &v, buf, sizeof(buf)) == -1, "accepted %s", bad[i]);
    }
    oi_slice_t other = {"{\"x\":[1,{\"a\":2}],\"a\":-3,\"a\":4}", 30};
    CHECK(oi_json_param(other, "a", &v, buf, sizeof(buf)) == 0 && v.kind == OI_JSON_PARAM_OTHER &&
          v.raw.len == 2 && memcmp(v.raw.ptr, "-3", 2) == 0);
    oi_slice_t none = {NULL, 0};
    CHECK(oi_json_param(none, "a", &v, buf, sizeof(buf)) == 0 && v.kind == OI_JSON_PARAM_ABSENT);

    /* An output placed in shared memory: its name, datatype and shape alone, as tritonserver
     * answers (no data, whatever `binary`, and no parameters). */
    oi_buf_t *b = oi_buf_new(8);
    b->len = 8;
    oi_tensor_t t = {.name = "o", .dtype = OI_TYPE_INT32, .ndim = 2, .shape = {1, 2}, .data = b->data,
                     .byte_size = 8, .shm = 1, .shm_region = "reg\"x", .shm_offset = 64};
    oi_response_t resp = {.outputs = &t, .n_outputs = 1};
    oi_sbuf_t out = {0};
    uint8_t bin[] = {1};
    oi_status_t *st = oi_json_encode_infer_response(&out, "m", NULL, NULL, &resp, bin);
    oi_sbuf_append(&out, "", 1);
    CHECKF(st == NULL && strcmp(out.data, "{\"model_name\":\"m\",\"outputs\":[{\"name\":\"o\",\"datatype\":\"INT32\","
                                          "\"shape\":[1,2]}]}") == 0,
           "%s", out.data);
    oi_status_free(st);
    oi_sbuf_free(&out);
    oi_buf_unref(b);
}

static int echo_stdin(void)
{
    oi_sbuf_t in = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), stdin)) > 0)
        oi_sbuf_append(&in, chunk, n);
    oi_buf_t *body = oi_buf_new(in.len);
    memcpy(body->data, in.data, in.len);
    body->len = in.len;
    oi_sbuf_free(&in);
    oi_request_t req = {.binary_data_output = -1};
    oi_status_t *st = oi_json_decode_infer_request(body, body->len, &req, NULL);
    char *out = NULL;
    if (st == NULL)
        out = echo(&req, NULL, NULL, &st);
    if (out != NULL) {
        fputs(out, stdout);
        free(out);
    } else {
        oi_sbuf_t err = {0};
        oi_json_encode_error(&err, st->message);
        fwrite(err.data, 1, err.len, stdout);
        oi_sbuf_free(&err);
        oi_status_free(st);
    }
    oi_request_clear(&req);
    oi_buf_unref(body);
    return out != NULL ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--echo") == 0)
        return echo_stdin();
    if (argc > 2 && strcmp(argv[1], "--locale") == 0) {
        test_locale(argv[2]);
        printf("%d passed, %d failed\n", passed, failed);
        return failed != 0;
    }
    test_all_types();
    test_float_text();
    test_float_rounding();
    round_trip_floats(OI_TYPE_FP16, 2, 65536);
    round_trip_floats(OI_TYPE_BF16, 2, 65536);
    round_trip_floats(OI_TYPE_FP32, 4, 100000);
    round_trip_floats(OI_TYPE_FP64, 8, 100000);
    test_shapes_and_nesting();
    test_request_fields();
    test_binary_inputs();
    test_errors();
    test_truncations();
    test_encode();
    test_shared_memory();
    test_params_same();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
