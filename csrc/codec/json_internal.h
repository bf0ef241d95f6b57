/* What the V2 JSON codec's files share (json_decode.c, json_encode.c, json_params.c); not for
 * use outside csrc/codec/json_*.c. */
#ifndef OI_CODEC_JSON_INTERNAL_H
#define OI_CODEC_JSON_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"

/* ---- Byte and UTF-8 helpers of the decoder and the encoder ------------------------------- */

static inline uint64_t oi__json_get_le(const char *src, size_t size)
{
    uint64_t v = 0;
    for (size_t i = 0; i < size; i++)
        v |= (uint64_t)(unsigned char)src[i] << (8 * i);
    return v;
}

/* Length of the valid UTF-8 sequence (RFC 3629: shortest form, no surrogates, at most
 * U+10FFFF) at p, which has n > 0 bytes; 0 when there is none. */
static inline size_t oi__json_utf8_len(const unsigned char *p, size_t n)
{
    unsigned char b = p[0], lo = 0x80, hi = 0xbf;
    size_t len;
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf) {
        len = 2;
    } else if (b >= 0xe0 && b <= 0xef) {
        len = 3;
        lo = b == 0xe0 ? 0xa0 : 0x80;
        hi = b == 0xed ? 0x9f : 0xbf;
    } else if (b >= 0xf0 && b <= 0xf4) {
        len = 4;
        lo = b == 0xf0 ? 0x90 : 0x80;
        hi = b == 0xf4 ? 0x8f : 0xbf;
    } else {
        return 0;
    }
    if (n < len || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((p[i] & 0xc0) != 0x80)
            return 0;
    return len;
}

static inline int oi__json_utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        if (*p < 0x80) {
            p++;
            continue;
        }
        size_t k = oi__json_utf8_len(p, (size_t)(end - p));
        if (k == 0)
            return 0;
        p += k;
    }
    return 1;
}

/* A byte that stands for itself inside a JSON string: printable ASCII but '"' and '\'. */
static inline int oi__json_is_plain(unsigned char b) { return b >= 0x20 && b < 0x80 && b != '"' && b != '\\'; }

/* ---- The decoder's reader, as json_params.c uses it --------------------------------------- */

typedef struct cursor_s {
    char *base;  /* first byte of the JSON; message offsets count from here */
    char *p;     /* next byte to read */
    char *end;   /* one past the last JSON byte */
    uint32_t depth;
    uint32_t max_depth;
    oi_status_t *err; /* the first failure; every caller stops there */
} cursor_t;

/* A short string read without changing the body: object keys and datatype names, which may
 * lie inside a "parameters" object whose raw text must stay intact. */
typedef struct short_str_s {
    const char *s;
    size_t n;
    char buf[128]; /* the decoded text of an escaped string */
} short_str_t;

/* Each is described where json_decode.c defines it. */
int oi__json_peek(cursor_t *c);
int oi__json_is_number_start(int ch);
int oi__json_scan_string(cursor_t *c, char **raw, size_t *len, int *escaped);
size_t oi__json_unescape(char *dst, const char *src, size_t n);
int oi__json_str_is(const short_str_t *k, const char *lit);
int oi__json_read_count(cursor_t *c, int64_t *out, char got[48]);
int oi__json_enter(cursor_t *c, char open);
int oi__json_next_member(cursor_t *c, uint32_t *n, short_str_t *key);
int oi__json_next_element(cursor_t *c, uint32_t *n);
int oi__json_skip_value(cursor_t *c);

#endif
