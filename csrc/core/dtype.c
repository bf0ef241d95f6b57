#include "dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} types[OI_TYPE_COUNT] = {
    [OI_TYPE_INVALID] = {"INVALID", 0}, [OI_TYPE_BOOL] = {"BOOL", 1},
    [OI_TYPE_UINT8] = {"UINT8", 1},     [OI_TYPE_UINT16] = {"UINT16", 2},
    [OI_TYPE_UINT32] = {"UINT32", 4},   [OI_TYPE_UINT64] = {"UINT64", 8},
    [OI_TYPE_INT8] = {"INT8", 1},       [OI_TYPE_INT16] = {"INT16", 2},
    [OI_TYPE_INT32] = {"INT32", 4},     [OI_TYPE_INT64] = {"INT64", 8},
    [OI_TYPE_FP16] = {"FP16", 2},       [OI_TYPE_FP32] = {"FP32", 4},
    [OI_TYPE_FP64] = {"FP64", 8},       [OI_TYPE_BF16] = {"BF16", 2},
    [OI_TYPE_BYTES] = {"BYTES", 0},
};

const char *oi_dtype_name(oi_dtype_t t)
{
    return (unsigned)t < OI_TYPE_COUNT ? types[t].name : "INVALID";
}

oi_dtype_t oi_dtype_from_name(const char *s, size_t n)
{
    for (int t = 1; t < OI_TYPE_COUNT; t++)
        if (strlen(types[t].name) == n && memcmp(types[t].name, s, n) == 0)
            return (oi_dtype_t)t;
    return OI_TYPE_INVALID;
}

size_t oi_dtype_size(oi_dtype_t t) { return (unsigned)t < OI_TYPE_COUNT ? types[t].size : 0; }

static uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float oi_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* inf or NaN */
        return bits_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return bits_float(sign);
        /* Subnormal half: value is man * 2^-24, exact in float. */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t oi_float_to_half(float f)
{
    uint32_t u = float_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u) /* inf or NaN: keep NaN quiet and non-zero */
        return sign | 0x7c00 | (absu > 0x7f800000u ? (uint16_t)(0x200 | ((absu >> 13) & 0x3ff)) : 0);
    if (absu >= 0x477ff000u) /* rounds to or beyond 65520: infinity */
        return sign | 0x7c00;
    if (absu < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (absu < 0x33000000u)
            return sign; /* below half of the smallest subnormal */
        uint32_t exp = absu >> 23;
        uint32_t man = (absu & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - exp; /* 14..24: man >> (shift) gives units of 2^-24 */
        uint32_t r = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (r & 1)))
            r++;
        return sign | (uint16_t)r;
    }
    uint32_t r = absu - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t out = r >> 13;
    uint32_t rem = r & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (out & 1)))
        out++;
    return sign | (uint16_t)out;
}

float oi_bf16_to_float(uint16_t h) { return bits_float((uint32_t)h << 16); }

uint16_t oi_float_to_bf16(float f)
{
    uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
