/* Numbers as JSON text: shortest round-trip printing of FP64, FP32, FP16 and BF16 values,
 * integer printing, and correctly rounded decimal-to-binary conversion. Pure functions that
 * read and write "C"-locale text whatever locale the process set: the JSON codec (json_*.c) is
 * their user. */
#ifndef OI_CODEC_NUM_H
#define OI_CODEC_NUM_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

/* The room a caller leaves at w for any oi_num_write_* call. Float text is at most 24
 * characters ("-2.2250738585072014e-308"), integers at most 20 and a sign; the float writers
 * move digits with fixed-size copies that may write scratch bytes past the text's end, within
 * this room. */
#define OI_NUM_ROOM 40

/* Write the value at w and return the end; nothing is NUL-terminated. */
char *oi_num_write_u64(char *w, uint64_t v);
char *oi_num_write_i64(char *w, int64_t v);

/* Floats are written as the shortest decimal that reads back (correctly rounded) to the same
 * value of their own type, the closest to it when several are as short, in the layout of
 * Python's repr(float): positional for decimal exponents -4..15 ("0.0001", "123.5", "1.0"),
 * else "1.5e-05" / "1e+16"; "-0.0"; NaN, Infinity and -Infinity as Python's json writes
 * them. `bits` is the value's IEEE encoding (FP16: binary16, BF16: the top half of a
 * binary32). Shortest digits come from Schubfach (R. Giulietti, "The Schubfach way to render
 * doubles", 2020), which needs no retries and no big numbers. */
char *oi_num_write_f64(char *w, uint64_t bits);
char *oi_num_write_f32(char *w, uint32_t bits);
char *oi_num_write_f16(char *w, uint16_t bits);
char *oi_num_write_bf16(char *w, uint16_t bits);

/* Writes the n numbers of type t (any integer or float type; not BOOL or BYTES) stored
 * little-endian at data, separated by `sep`, and returns the end. The caller leaves
 * n * (OI_NUM_ROOM + 1) bytes at w. One call per run of values keeps the writers inlined in
 * one loop: called once per value, a float writer spends about a quarter of its time on
 * entering and leaving the call. Returns NULL for another type. */
char *oi_num_write_list(char *w, const void *data, size_t n, oi_dtype_t t, char sep);

/* The fast path of decimal-to-binary conversion (Eisel-Lemire: a 64x128-bit product with a
 * 128-bit power of five): stores in *bits the encoding of the positive value mant * 10^exp10
 * correctly rounded to float type t (OI_TYPE_FP64 or FP32; overflow gives infinity, underflow
 * zero) and returns 1, or returns 0 when the truncated power of five leaves the rounding
 * undecided (within 2^-64 relative of a halfway point, or at the smallest subnormals); the
 * caller then uses oi_num_parse_exact. */
int oi_num_parse_fast(uint64_t mant, int32_t exp10, oi_dtype_t t, uint64_t *bits);

/* The exact path: the encoding in type t (FP64 or FP32) of the JSON number `text`
 * (NUL-terminated, an optional '-' included), correctly rounded at any length: the C
 * library's strtod and strtof, which glibc rounds correctly with big-number arithmetic, run
 * under the "C" locale installed on the calling thread for the length of the call. */
uint64_t oi_num_parse_exact(const char *text, oi_dtype_t t);

/* The FP16 or BF16 encoding nearest the double with encoding `bits` (ties to even; NaN stays
 * a quiet NaN). JSON numbers become FP16 and BF16 through their nearest double, as
 * numpy.float16(float(text)) does: the double a client meant is what gets narrowed. */
uint16_t oi_num_narrow_f64(uint64_t bits, oi_dtype_t t);

#endif
