/* The V2 tensor datatypes: names, element sizes and FP16/BF16 conversions. */
#ifndef OI_CORE_DTYPE_H
#define OI_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    OI_TYPE_INVALID = 0,
    OI_TYPE_BOOL,
    OI_TYPE_UINT8,
    OI_TYPE_UINT16,
    OI_TYPE_UINT32,
    OI_TYPE_UINT64,
    OI_TYPE_INT8,
    OI_TYPE_INT16,
    OI_TYPE_INT32,
    OI_TYPE_INT64,
    OI_TYPE_FP16,
    OI_TYPE_FP32,
    OI_TYPE_FP64,
    OI_TYPE_BF16,
    OI_TYPE_BYTES,
    OI_TYPE_COUNT
} oi_dtype_t;

/* Returns the protocol name ("INT32"), or "INVALID". */
const char *oi_dtype_name(oi_dtype_t t);

/* Parses a protocol name of `n` bytes (case-sensitive); OI_TYPE_INVALID if unknown. */
oi_dtype_t oi_dtype_from_name(const char *s, size_t n);

/* Bytes per element; 0 for BYTES, whose elements are a 4-byte little-endian length then
 * the bytes. */
size_t oi_dtype_size(oi_dtype_t t);

/* IEEE half and bfloat16 conversions, round-to-nearest-even, NaN preserved. */
float oi_half_to_float(uint16_t h);
uint16_t oi_float_to_half(float f);
float oi_bf16_to_float(uint16_t h);
uint16_t oi_float_to_bf16(float f);

#endif
