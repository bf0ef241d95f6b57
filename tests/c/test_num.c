/* A hook for tests/test_num_codec.py and `make test-floats-exhaustive` over csrc/codec/num.c.
 *
 *   test_num --print       lines "T HEX" in (T: d FP64, f FP32, h FP16, b BF16; HEX: the
 *                          value's encoding), the text oi_num_write_* gives out, one a line
 *   test_num --parse       lines "T TEXT" in, the encoding the JSON decoder stores out (HEX),
 *                          by the same steps as json_decode.c: Eisel-Lemire, else the exact path;
 *                          FP16/BF16 through the double
 *   test_num --exhaustive [FIRST LAST [THREADS]]
 *                          every FP32 encoding in [FIRST, LAST] (hex; default all 2^32, on
 *                          THREADS threads, default 1) and
 *                          every FP16 and BF16 one: printed, then read back by the decoder's
 *                          path and (FP32) by strtof, which must both give the same encoding
 *                          (NaN: a NaN); prints the counts and exits 1 on any mismatch */
#include "codec/num.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int type_of(char c, oi_dtype_t *t)
{
    switch (c) {
    case 'd': *t = OI_TYPE_FP64; return 0;
    case 'f': *t = OI_TYPE_FP32; return 0;
    case 'h': *t = OI_TYPE_FP16; return 0;
    case 'b': *t = OI_TYPE_BF16; return 0;
    default: return -1;
    }
}

static char *write_bits(char *w, oi_dtype_t t, uint64_t bits)
{
    switch (t) {
    case OI_TYPE_FP64: return oi_num_write_f64(w, bits);
    case OI_TYPE_FP32: return oi_num_write_f32(w, (uint32_t)bits);
    case OI_TYPE_FP16: return oi_num_write_f16(w, (uint16_t)bits);
    default: return oi_num_write_bf16(w, (uint16_t)bits);
    }
}

/* What json_decode.c's num_to_bits does with a plain JSON number (no NaN/Infinity tokens). */
static uint64_t parse_text(const char *s, oi_dtype_t t, int *fast)
{
    if (t == OI_TYPE_FP16 || t == OI_TYPE_BF16)
        return oi_num_narrow_f64(parse_text(s, OI_TYPE_FP64, fast), t);
    const char *p = s;
    int neg = *p == '-';
    p += neg;
    uint64_t mant = 0;
    int64_t exp10 = 0;
    int overflow = 0, point = 0;
    for (; *p && *p != 'e' && *p != 'E'; p++) {
        if (*p == '.') {
            point = 1;
            continue;
        }
        if (mant > (UINT64_MAX - 9) / 10) {
            overflow = 1;
            break;
        }
        mant = mant * 10 + (uint64_t)(*p - '0');
        exp10 -= point;
    }
    if (!overflow && (*p == 'e' || *p == 'E'))
        exp10 += strtol(p + 1, NULL, 10);
    uint64_t bits;
    *fast = !overflow && exp10 > -100000 && exp10 < 100000 && oi_num_parse_fast(mant, (int32_t)exp10, t, &bits);
    if (*fast)
        return neg ? bits | (UINT64_C(1) << (t == OI_TYPE_FP64 ? 63 : 31)) : bits;
    return oi_num_parse_exact(s, t);
}

static int lines(int parse)
{
    char line[4096], out[64];
    long fast_count = 0, total = 0;
    while (fgets(line, sizeof(line), stdin)) {
        line[strcspn(line, "\r\n")] = '\0';
        oi_dtype_t t;
        if (strlen(line) < 3 || type_of(line[0], &t) != 0) {
            fprintf(stderr, "bad line: %s\n", line);
            return 2;
        }
        if (parse) {
            int fast;
            printf("%" PRIx64 "\n", parse_text(line + 2, t, &fast));
            fast_count += fast;
            total++;
        } else {
            *write_bits(out, t, strtoull(line + 2, NULL, 16)) = '\0';
            puts(out);
        }
    }
    if (parse)
        fprintf(stderr, "fast path: %ld of %ld\n", fast_count, total);
    return 0;
}

static int is_nan(uint64_t bits, oi_dtype_t t)
{
    switch (t) {
    case OI_TYPE_FP32: return (bits & 0x7fffffff) > 0x7f800000;
    case OI_TYPE_FP16: return (bits & 0x7fff) > 0x7c00;
    default: return (bits & 0x7fff) > 0x7f80;
    }
}

/* Reads back a printed value; NaN and the infinities are the JSON tokens, not numbers. */
static int round_trips(const char *text, uint64_t bits, oi_dtype_t t)
{
    if (is_nan(bits, t))
        return strcmp(text, "NaN") == 0;
    if (strcmp(text, "Infinity") == 0 || strcmp(text, "-Infinity") == 0) {
        uint64_t inf = t == OI_TYPE_FP32 ? 0x7f800000 : t == OI_TYPE_FP16 ? 0x7c00 : 0x7f80;
        uint64_t sign = t == OI_TYPE_FP32 ? 0x80000000 : 0x8000;
        return bits == (text[0] == '-' ? sign | inf : inf);
    }
    int fast;
    if (parse_text(text, t, &fast) != bits)
        return 0;
    if (t == OI_TYPE_FP32) {
        float f = strtof(text, NULL);
        uint32_t u;
        memcpy(&u, &f, sizeof(u));
        return u == bits;
    }
    return 1;
}

typedef struct range_s {
    uint64_t first, last, bad;
} range_t;

static void *check_range(void *arg)
{
    range_t *r = arg;
    char out[64];
    for (uint64_t b = r->first; b <= r->last; b++) {
        *oi_num_write_f32(out, (uint32_t)b) = '\0';
        if (!round_trips(out, b, OI_TYPE_FP32) && r->bad++ < 10)
            printf("FP32 %08" PRIx64 " printed %s does not read back\n", b, out);
    }
    return NULL;
}

static int exhaustive(uint64_t first, uint64_t last, int threads)
{
    char out[64];
    uint64_t bad = 0, n = last - first + 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    range_t ranges[64];
    pthread_t tids[64];
    for (int i = 0; i < threads; i++) {
        ranges[i].first = first + n * (uint64_t)i / (uint64_t)threads;
        ranges[i].last = first + n * (uint64_t)(i + 1) / (uint64_t)threads - 1;
        ranges[i].bad = 0;
        if (pthread_create(&tids[i], NULL, check_range, &ranges[i]) != 0)
            return 2;
    }
    for (int i = 0; i < threads; i++) {
        pthread_join(tids[i], NULL);
        bad += ranges[i].bad;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("FP32: %" PRIu64 " encodings [%08" PRIx64 ", %08" PRIx64 "], %" PRIu64 " mismatches, %.1f s on %d threads\n",
           n, first, last, bad, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9, threads);
    uint64_t bad16 = 0;
    for (int k = 0; k < 2; k++) {
        oi_dtype_t t = k ? OI_TYPE_BF16 : OI_TYPE_FP16;
        for (uint64_t b = 0; b < 0x10000; b++) {
            *write_bits(out, t, b) = '\0';
            if (!round_trips(out, b, t) && bad16++ < 20)
                printf("%s %04" PRIx64 " printed %s does not read back\n", k ? "BF16" : "FP16", b, out);
        }
    }
    printf("FP16, BF16: 131072 encodings, %" PRIu64 " mismatches\n", bad16);
    return bad || bad16 ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "--print") == 0)
        return lines(0);
    if (argc >= 2 && strcmp(argv[1], "--parse") == 0)
        return lines(1);
    if (argc >= 2 && strcmp(argv[1], "--exhaustive") == 0) {
        uint64_t first = argc > 2 ? strtoull(argv[2], NULL, 16) : 0;
        uint64_t last = argc > 3 ? strtoull(argv[3], NULL, 16) : UINT32_MAX;
        int threads = argc > 4 ? atoi(argv[4]) : 1;
        if (last > UINT32_MAX || first > last || threads < 1 || threads > 64) {
            fprintf(stderr, "bad range or thread count\n");
            return 2;
        }
        return exhaustive(first, last, threads);
    }
    fprintf(stderr, "usage: %s --print | --parse | --exhaustive [FIRST LAST [THREADS]]\n", argv[0]);
    return 2;
}
