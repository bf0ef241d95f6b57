/* The V2 JSON codec's decoders: inference requests (server) and responses (client). The writers
 * are in json_encode.c, the reader of "parameters" texts in json_params.c.
 *
 * Decoding is one pass of recursive descent over the body with a cursor; nothing is built
 * but the request itself. The schema directs it: tensor elements are converted straight into
 * the typed buffer as they are met, keys are matched without copying, names are unescaped in
 * place. Only an input whose "data" comes before its "shape" or "datatype" is walked twice:
 * once to skip it, once, when the input object has closed, to convert it.
 *
 * Numbers are converted by num.c, in the "C" locale whatever the process set. */
#define _POSIX_C_SOURCE 200809L

#include "json.h"
#include "json_internal.h"

#include "num.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Small shared helpers ---------------------------------------------------------------- */

static int is_digit(int ch) { return ch >= '0' && ch <= '9'; }

static int is_signed_int(oi_dtype_t t) { return t >= OI_TYPE_INT8 && t <= OI_TYPE_INT64; }

static int is_integer(oi_dtype_t t)
{
    return (t >= OI_TYPE_UINT8 && t <= OI_TYPE_UINT64) || is_signed_int(t);
}

/* Stores the low `size` bytes of v little-endian (the wire order of every tensor). */
static void put_le(char *dst, uint64_t v, size_t size)
{
    for (size_t i = 0; i < size; i++)
        dst[i] = (char)(v >> (8 * i));
}

/* ---- Cursor and errors -------------------------------------------------------------------- */

static size_t offset(const cursor_t *c) { return (size_t)(c->p - c->base); }

static int bad(cursor_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Records a 400 error (the first one wins) and returns -1 for the caller to pass up. */
static int bad(cursor_t *c, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (c->err == NULL)
        c->err = oi_status_new(OI_BAD_REQUEST, "%s", msg);
    return -1;
}

static int out_of_memory(cursor_t *c)
{
    if (c->err == NULL)
        c->err = oi_status_new(OI_INTERNAL, "out of memory while decoding the request");
    return -1;
}

/* Reports malformed JSON at p. */
static int bad_at(cursor_t *c, char *p, const char *what)
{
    c->p = p;
    return bad(c, "malformed JSON at byte %zu: %s", offset(c), what);
}

/* Reports malformed JSON at the cursor: what the grammar wanted and the byte found. */
static int syntax(cursor_t *c, const char *expected)
{
    char got[16];
    if (c->p >= c->end)
        snprintf(got, sizeof(got), "end of input");
    else if (*c->p >= 0x20 && *c->p < 0x7f)
        snprintf(got, sizeof(got), "'%c'", *c->p);
    else
        snprintf(got, sizeof(got), "byte 0x%02x", (unsigned char)*c->p);
    return bad(c, "malformed JSON at byte %zu: expected %s, got %s", offset(c), expected, got);
}

/* Skips whitespace and returns the next byte, or -1 at the end of the JSON. */
int oi__json_peek(cursor_t *c)
{
    char *p = c->p;
    while (p < c->end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    c->p = p;
    return p < c->end ? (unsigned char)*p : -1;
}

int oi__json_is_number_start(int ch) { return is_digit(ch) || ch == '-' || ch == 'N' || ch == 'I'; }

/* 1 when the text at the cursor starts with the literal `word`. */
static int at_literal(const cursor_t *c, const char *word)
{
    size_t n = strlen(word);
    return (size_t)(c->end - c->p) >= n && memcmp(c->p, word, n) == 0;
}

/* Names the kind of value at the cursor (after peek) for "expected X, got Y" messages. */
static const char *value_kind(const cursor_t *c)
{
    int ch = c->p < c->end ? (unsigned char)*c->p : -1;
    if ((ch == 't' && !at_literal(c, "true")) || (ch == 'f' && !at_literal(c, "false")) ||
        (ch == 'n' && !at_literal(c, "null")))
        return "malformed JSON";
    switch (ch) {
    case -1:
        return "end of input";
    case '"':
        return "string";
    case '{':
        return "object";
    case '[':
        return "array";
    case 't':
    case 'f':
        return "boolean";
    case 'n':
        return "null";
    default:
        return oi__json_is_number_start(ch) ? "number" : "malformed JSON";
    }
}

/* Names a field for messages: "inputs[2].shape", "inputs[2]", or "shape" at the top level. */
static const char *where(char buf[64], const char *group, uint32_t index, const char *field)
{
    if (group == NULL)
        snprintf(buf, 64, "%s", field);
    else
        snprintf(buf, 64, "%s[%" PRIu32 "]%s%s", group, index, *field ? "." : "", field);
    return buf;
}

/* ---- Strings -------------------------------------------------------------------------------- */

/* Value of four hex digits, or -1. */
static long hex4(const char *p)
{
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int ch = (unsigned char)p[i], d;
        if (is_digit(ch))
            d = ch - '0';
        else if (ch >= 'a' && ch <= 'f')
            d = ch - 'a' + 10;
        else if (ch >= 'A' && ch <= 'F')
            d = ch - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Checks the escape at p (on its backslash); returns its length (2, 6, or 12 for a surrogate
 * pair) or 0 after reporting why it is invalid. */
static size_t check_escape(cursor_t *c, char *p)
{
    const char *why;
    if (c->end - p < 2) {
        why = "unterminated string";
    } else if (strchr("\"\\/bfnrt", p[1]) != NULL && p[1] != '\0') {
        return 2;
    } else if (p[1] != 'u') {
        why = "invalid escape in string";
    } else {
        long u = c->end - p >= 6 ? hex4(p + 2) : -1, lo = -1;
        if (u < 0) {
            why = "expected 4 hex digits after \\u";
        } else if (u < 0xd800 || u > 0xdfff) {
            return 6;
        } else {
            if (u <= 0xdbff && c->end - p >= 12 && p[6] == '\\' && p[7] == 'u')
                lo = hex4(p + 8);
            if (lo >= 0xdc00 && lo <= 0xdfff)
                return 12;
            why = "lone UTF-16 surrogate escape in string";
        }
    }
    bad_at(c, p, why);
    return 0;
}

/* Validates the string literal at the cursor (on its opening quote) without changing it:
 * escapes, surrogate pairs, UTF-8, no raw control characters. Leaves the cursor past the
 * closing quote with *raw at the first byte inside the quotes, *len the escaped length and
 * *escaped telling whether a backslash occurred. */
int oi__json_scan_string(cursor_t *c, char **raw, size_t *len, int *escaped)
{
    char *start = c->p + 1, *p = start, *end = c->end;
    int esc = 0;
    for (;;) {
        while (p < end && oi__json_is_plain((unsigned char)*p))
            p++;
        if (p >= end)
            return bad_at(c, p, "unterminated string");
        unsigned char b = (unsigned char)*p;
        size_t k;
        if (b == '"')
            break;
        if (b == '\\') {
            esc = 1;
            k = check_escape(c, p);
        } else if (b < 0x20) {
            char what[64];
            snprintf(what, sizeof(what), "unescaped control character 0x%02x in string", b);
            return bad_at(c, p, what);
        } else {
            k = oi__json_utf8_len((const unsigned char *)p, (size_t)(end - p));
            if (k == 0)
                return bad_at(c, p, "invalid UTF-8 in string");
        }
        if (k == 0)
            return -1;
        p += k;
    }
    *raw = start;
    *len = (size_t)(p - start);
    *escaped = esc;
    c->p = p + 1;
    return 0;
}

static char *put_utf8(char *w, uint32_t cp)
{
    if (cp < 0x80) {
        *w++ = (char)cp;
    } else if (cp < 0x800) {
        *w++ = (char)(0xc0 | (cp >> 6));
        *w++ = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        *w++ = (char)(0xe0 | (cp >> 12));
        *w++ = (char)(0x80 | ((cp >> 6) & 0x3f));
        *w++ = (char)(0x80 | (cp & 0x3f));
    } else {
        *w++ = (char)(0xf0 | (cp >> 18));
        *w++ = (char)(0x80 | ((cp >> 12) & 0x3f));
        *w++ = (char)(0x80 | ((cp >> 6) & 0x3f));
        *w++ = (char)(0x80 | (cp & 0x3f));
    }
    return w;
}

/* Decodes the n bytes of a string that oi__json_scan_string accepted into dst, which may be src: the
 * decoded text is never longer. Returns the decoded length. */
size_t oi__json_unescape(char *dst, const char *src, size_t n)
{
    const char *end = src + n;
    char *w = dst;
    while (src < end) {
        const char *bs = memchr(src, '\\', (size_t)(end - src));
        size_t run = (size_t)((bs ? bs : end) - src);
        memmove(w, src, run);
        w += run;
        if (bs == NULL)
            break;
        char e = bs[1];
        src = bs + 2;
        switch (e) {
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            uint32_t cp = (uint32_t)hex4(src);
            src += 4;
            if (cp >= 0xd800 && cp <= 0xdbff) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + ((uint32_t)hex4(src + 2) - 0xdc00);
                src += 6;
            }
            w = put_utf8(w, cp);
            break;
        }
        default: *w++ = e; /* '"', '\\' or '/' */
        }
    }
    return (size_t)(w - dst);
}

/* Reads a string value, unescaping it in place and NUL-terminating it where its closing
 * quote was, so that it can be used where it lies. */
static int read_string_in_place(cursor_t *c, char **s, size_t *n)
{
    char *raw;
    size_t len;
    int escaped;
    if (oi__json_scan_string(c, &raw, &len, &escaped) != 0)
        return -1;
    if (escaped)
        len = oi__json_unescape(raw, raw, len);
    raw[len] = '\0';
    *s = raw;
    *n = len;
    return 0;
}

static int read_short(cursor_t *c, short_str_t *k)
{
    char *raw;
    size_t len;
    int escaped;
    if (oi__json_scan_string(c, &raw, &len, &escaped) != 0)
        return -1;
    k->s = raw;
    k->n = len;
    /* An escaped string too long for buf stays raw: every name we look for is short ASCII,
     * at most 6 escaped bytes a character, so such a string can match none of them. */
    if (escaped && len <= sizeof(k->buf)) {
        k->n = oi__json_unescape(k->buf, raw, len);
        k->s = k->buf;
    }
    return 0;
}

int oi__json_str_is(const short_str_t *k, const char *lit)
{
    size_t n = strlen(lit);
    return k->n == n && memcmp(k->s, lit, n) == 0;
}

/* ---- Numbers ---------------------------------------------------------------------------- */

enum { NUM_FINITE, NUM_NAN, NUM_INF };

/* A number token as scanned: its text, and the exact decimal value while it fits. */
typedef struct num_s {
    char *text;
    size_t len;
    uint64_t mant; /* every digit, as an integer, unless `overflow` */
    int32_t exp10; /* value = mant * 10^exp10 */
    uint8_t neg;
    uint8_t is_int;   /* no fraction and no exponent */
    uint8_t overflow; /* the digits did not fit mant */
    uint8_t special;  /* NUM_NAN or NUM_INF */
} num_t;

static inline void add_digit(num_t *n, int d)
{
    if (n->mant <= (UINT64_MAX - 9) / 10) /* the common case: no digit can overflow it */
        n->mant = n->mant * 10 + (uint64_t)d;
    else if (n->mant > (UINT64_MAX - (uint64_t)d) / 10)
        n->overflow = 1;
    else
        n->mant = n->mant * 10 + (uint64_t)d;
}

/* The value of the eight ASCII digits at p, or -1 when they are not all digits. On
 * little-endian targets all eight at once in one 64-bit word: a digit byte is 0x30..0x39, so
 * its high nibble is 3 both as is and plus 6; then pairs, then quads, combined by multiplies
 * (the SWAR method of Lemire's fast_float). */
static inline int64_t eight_digits(const char *p)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v;
    memcpy(&v, p, 8);
    const uint64_t high = UINT64_C(0xF0F0F0F0F0F0F0F0);
    if (((v & high) | (((v + UINT64_C(0x0606060606060606)) & high) >> 4)) != UINT64_C(0x3333333333333333))
        return -1;
    v -= UINT64_C(0x3030303030303030);
    v = v * 10 + (v >> 8); /* bytes 0, 2, 4, 6: two-digit numbers */
    const uint64_t pairs = UINT64_C(0x000000FF000000FF);
    v = ((v & pairs) * UINT64_C(0x000F424000000064) + ((v >> 16) & pairs) * UINT64_C(0x0000271000000001)) >> 32;
    return (int64_t)(uint32_t)v;
#else
    int64_t v = 0;
    for (int i = 0; i < 8; i++) {
        if (!is_digit(p[i]))
            return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
#endif
}

/* Adds digits at p to n eight at a time while eight more cannot overflow it; returns where
 * it stopped and adds the count taken to *taken. The rest go one by one. */
static char *add_eight_digits(num_t *n, char *p, const char *end, int64_t *taken)
{
    while (end - p >= 8 && n->mant <= (UINT64_MAX - 99999999) / 100000000) {
        int64_t v = eight_digits(p);
        if (v < 0)
            break;
        n->mant = n->mant * 100000000 + (uint64_t)v;
        p += 8;
        *taken += 8;
    }
    return p;
}

/* Ends a number token at p. A number always has a byte after it in a well-formed request
 * (a ',' or a closing bracket), and the conversions below borrow that byte for a NUL. */
static int end_number(cursor_t *c, num_t *n, char *p)
{
    if (p >= c->end)
        return bad_at(c, p, "unexpected end of input");
    n->len = (size_t)(p - n->text);
    c->p = p;
    return 0;
}

/* Scans a JSON number at the cursor, or one of the tokens NaN, Infinity and -Infinity that
 * Python's json module writes for non-finite floats. */
static int scan_number(cursor_t *c, num_t *n)
{
    char *p = c->p, *end = c->end;
    memset(n, 0, sizeof(*n));
    n->text = p;
    if (p < end && *p == '-') {
        n->neg = 1;
        p++;
    }
    if (p < end && (*p == 'N' || *p == 'I')) {
        const char *word = *p == 'N' ? "NaN" : "Infinity";
        size_t k = strlen(word);
        if ((*p == 'N' && n->neg) || (size_t)(end - p) < k || memcmp(p, word, k) != 0) {
            c->p = n->text;
            return syntax(c, "a value");
        }
        n->special = *p == 'N' ? NUM_NAN : NUM_INF;
        return end_number(c, n, p + k);
    }
    if (p >= end || !is_digit(*p)) {
        c->p = p;
        return syntax(c, n->neg ? "a digit" : "a value");
    }
    if (*p == '0') {
        if (++p < end && is_digit(*p))
            return bad_at(c, p, "leading zeros are not allowed in numbers");
    } else {
        int64_t taken = 0;
        for (p = add_eight_digits(n, p, end, &taken); p < end && is_digit(*p); p++)
            add_digit(n, *p - '0');
    }
    int64_t exp10 = 0;
    n->is_int = 1;
    if (p < end && *p == '.') {
        n->is_int = 0;
        if (++p >= end || !is_digit(*p))
            return bad_at(c, p, "expected a digit after '.'");
        int64_t taken = 0;
        p = add_eight_digits(n, p, end, &taken);
        exp10 -= taken;
        for (; p < end && is_digit(*p); p++) {
            add_digit(n, *p - '0');
            if (!n->overflow) /* past an overflow only the slow path reads the text */
                exp10--;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        n->is_int = 0;
        int eneg = 0;
        if (++p < end && (*p == '-' || *p == '+'))
            eneg = *p++ == '-';
        if (p >= end || !is_digit(*p))
            return bad_at(c, p, "expected a digit in the exponent");
        int64_t e = 0;
        for (; p < end && is_digit(*p); p++)
            if (e < 100000000) /* far past any float's range; keeps the sum in range */
                e = e * 10 + (*p - '0');
        exp10 += eneg ? -e : e;
    }
    n->exp10 = (int32_t)(exp10 < -1000000000 ? -1000000000 : exp10);
    return end_number(c, n, p);
}

/* The encoding of a number token in float type t: FP64 and FP32 correctly rounded
 * (Eisel-Lemire when the digits fit 64 bits and it decides, else the exact path, which needs a
 * terminated string: the byte after the token is lent for the NUL); FP16 and BF16 through the
 * nearest double. */
static uint64_t num_to_bits(num_t *n, oi_dtype_t t)
{
    if (t == OI_TYPE_FP16 || t == OI_TYPE_BF16)
        return oi_num_narrow_f64(num_to_bits(n, OI_TYPE_FP64), t);
    uint64_t sign = n->neg ? UINT64_C(1) << (8 * oi_dtype_size(t) - 1) : 0, bits;
    if (n->special) {
        if (n->special == NUM_NAN)
            return t == OI_TYPE_FP32 ? 0x7fc00000 : UINT64_C(0x7ff8000000000000);
        return sign | (t == OI_TYPE_FP32 ? 0x7f800000 : UINT64_C(0x7ff0000000000000));
    }
    if (!n->overflow && oi_num_parse_fast(n->mant, n->exp10, t, &bits))
        return sign | bits;
    char saved = n->text[n->len];
    n->text[n->len] = '\0';
    bits = oi_num_parse_exact(n->text, t);
    n->text[n->len] = saved;
    return bits;
}

/* 1 when bits encode an infinity of float type t. */
static int is_inf_bits(uint64_t bits, oi_dtype_t t)
{
    switch (t) {
    case OI_TYPE_FP16: return (bits & 0x7fff) == 0x7c00;
    case OI_TYPE_BF16: return (bits & 0x7fff) == 0x7f80;
    case OI_TYPE_FP32: return (bits & 0x7fffffff) == 0x7f800000;
    default: return (bits & ~(UINT64_C(1) << 63)) == UINT64_C(0x7ff0000000000000);
    }
}

/* Reads a non-negative integer that fits int64 (a dimension or a byte count). Returns 0; 1
 * when the value is something else, described in `got`; -1 on malformed JSON. */
int oi__json_read_count(cursor_t *c, int64_t *out, char got[48])
{
    if (!oi__json_is_number_start(oi__json_peek(c))) {
        snprintf(got, 48, "%s", value_kind(c));
        return 1;
    }
    num_t num;
    if (scan_number(c, &num) != 0)
        return -1;
    if (!num.is_int || num.overflow || (num.neg && num.mant) || num.mant > INT64_MAX) {
        snprintf(got, 48, "%.*s", (int)(num.len < 40 ? num.len : 40), num.text);
        return 1;
    }
    *out = (int64_t)num.mant;
    return 0;
}

/* ---- Structure -------------------------------------------------------------------------- */

static int literal(cursor_t *c, const char *word)
{
    size_t k = strlen(word);
    if ((size_t)(c->end - c->p) < k || memcmp(c->p, word, k) != 0)
        return bad(c, "malformed JSON at byte %zu: expected '%s'", offset(c), word);
    c->p += k;
    return 0;
}

/* Enters the object or array opened at the cursor, within the nesting limit (refused in
 * tritonserver's words, and where). */
int oi__json_enter(cursor_t *c, char open)
{
    if (oi__json_peek(c) != open)
        return syntax(c, open == '{' ? "'{'" : "'['");
    if (c->depth >= c->max_depth)
        return bad(c, "JSON nesting depth exceeds maximum allowed limit (%" PRIu32 ") at byte %zu", c->max_depth,
                   offset(c));
    c->depth++;
    c->p++;
    return 0;
}

/* Steps through an object after oi__json_enter(): returns 1 with the cursor on the next member's
 * value (its key in *key unless key is NULL), 0 after the closing '}', or -1. *n counts the
 * members seen. */
int oi__json_next_member(cursor_t *c, uint32_t *n, short_str_t *key)
{
    int ch = oi__json_peek(c);
    if (ch == '}') {
        c->p++;
        c->depth--;
        return 0;
    }
    if (*n > 0) {
        if (ch != ',')
            return syntax(c, "',' or '}'");
        c->p++;
        ch = oi__json_peek(c);
    }
    if (ch != '"')
        return syntax(c, *n > 0 ? "a string key" : "a string key or '}'");
    if (key != NULL) {
        if (read_short(c, key) != 0)
            return -1;
    } else {
        char *raw;
        size_t len;
        int escaped;
        if (oi__json_scan_string(c, &raw, &len, &escaped) != 0)
            return -1;
    }
    if (oi__json_peek(c) != ':')
        return syntax(c, "':'");
    c->p++;
    oi__json_peek(c);
    (*n)++;
    return 1;
}

/* Steps through an array after oi__json_enter(): returns 1 with the cursor on the next element, 0
 * after the closing ']', or -1. */
int oi__json_next_element(cursor_t *c, uint32_t *n)
{
    int ch = oi__json_peek(c);
    if (ch == ']') {
        c->p++;
        c->depth--;
        return 0;
    }
    if (*n > 0) {
        if (ch != ',')
            return syntax(c, "',' or ']'");
        c->p++;
        oi__json_peek(c);
    }
    (*n)++;
    return 1;
}

/* Validates and passes over any value: unknown keys, deferred tensor data, parameters. The
 * recursion is bounded by max_depth, itself capped at OI_JSON_MAX_DEPTH. */
int oi__json_skip_value(cursor_t *c)
{
    uint32_t n = 0;
    int r;
    switch (oi__json_peek(c)) {
    case '"': {
        char *raw;
        size_t len;
        int escaped;
        return oi__json_scan_string(c, &raw, &len, &escaped);
    }
    case '{':
        if (oi__json_enter(c, '{') != 0)
            return -1;
        while ((r = oi__json_next_member(c, &n, NULL)) == 1)
            if (oi__json_skip_value(c) != 0)
                return -1;
        return r;
    case '[':
        if (oi__json_enter(c, '[') != 0)
            return -1;
        while ((r = oi__json_next_element(c, &n)) == 1)
            if (oi__json_skip_value(c) != 0)
                return -1;
        return r;
    case 't':
        return literal(c, "true");
    case 'f':
        return literal(c, "false");
    case 'n':
        return literal(c, "null");
    default: {
        num_t num;
        if (scan_number(c, &num) != 0)
            return -1;
        if (num.special) { /* Python's json writes them; RFC 8259 has no such numbers */
            c->p = num.text;
            return bad(c,
                       "malformed JSON at byte %zu: %.*s is not a JSON number; NaN, Infinity and -Infinity are "
                       "accepted only as elements of FP16, FP32, FP64 and BF16 tensor data",
                       offset(c), (int)num.len, num.text);
        }
        return 0;
    }
    }
}

/* Looks a key up in a NULL-terminated list of names; -1 when it is none of them. */
static int key_index(const short_str_t *k, const char *const *names)
{
    for (int i = 0; names[i] != NULL; i++)
        if (oi__json_str_is(k, names[i]))
            return i;
    return -1;
}

/* Marks a known key as seen. A repeated key is an error rather than "the last one wins", so
 * that no tensor is ever decoded twice. */
static int claim_key(cursor_t *c, uint32_t *seen, int key, const char *const *names,
                     const char *group, uint32_t index)
{
    char path[64];
    if (key < 0)
        return 0;
    if (*seen & (1u << key)) {
        if (group == NULL)
            return bad(c, "duplicate key '%s'", names[key]);
        return bad(c, "%s: duplicate key '%s'", where(path, group, index, ""), names[key]);
    }
    *seen |= 1u << key;
    return 0;
}

/* ---- Request ----------------------------------------------------------------------------- */

typedef struct decoder_s {
    cursor_t c;
    oi_buf_t *body;
    oi_request_t *req;
    oi_json_response_t *resp; /* decoding a response: its tensors go to req->inputs */
    const char *group;        /* "inputs", or "outputs" in a response */
    const char *kind;         /* "input" or "output", for messages */
    size_t bin_used; /* bytes after the JSON taken by binary inputs so far */
} decoder_t;

/* A "parameters" object: its raw text is kept, and the parameters the codec acts on are read
 * from it. */
typedef struct param_s {
    const char *key;
    int is_bool;   /* a boolean, else a non-negative integer */
    int64_t value; /* -1 while absent */
} param_t;

static int read_param(cursor_t *c, const char *group, uint32_t index, param_t *want)
{
    char path[64], full[96], got[48];
    snprintf(full, sizeof(full), "%s.%s", where(path, group, index, "parameters"), want->key);
    if (!want->is_bool) {
        int r = oi__json_read_count(c, &want->value, got);
        return r == 1 ? bad(c, "%s: expected a non-negative integer, got %s", full, got) : r;
    }
    int ch = oi__json_peek(c);
    if (ch != 't' && ch != 'f')
        return bad(c, "%s: expected a boolean, got %s", full, value_kind(c));
    want->value = ch == 't';
    return literal(c, ch == 't' ? "true" : "false");
}

/* Reads one of Triton's sequence parameters into `req->seq`, worded as Triton's HTTP frontend
 * words a wrong type. A string id is copied (unescaped) into the request's aux buffer: the
 * body's text stays untouched, since the model gets the parameters object as it came. */
static int read_seq_param(cursor_t *c, oi_request_t *req, const short_str_t *key)
{
    int ch = oi__json_peek(c);
    int is_start = oi__json_str_is(key, "sequence_start");
    if (is_start || oi__json_str_is(key, "sequence_end")) {
        if ((ch != 't' && ch != 'f') || !at_literal(c, ch == 't' ? "true" : "false"))
            return bad(c, "Unable to parse '%s': attempt to access JSON non-boolean as boolean",
                       is_start ? "sequence_start" : "sequence_end");
        *(is_start ? &req->seq.start : &req->seq.end) = ch == 't';
        return literal(c, ch == 't' ? "true" : "false");
    }
    req->seq.id = 0;
    req->seq.id_str = NULL;
    req->seq.id_str_len = 0;
    if (ch == '"') {
        char *raw;
        size_t len;
        int escaped;
        if (oi__json_scan_string(c, &raw, &len, &escaped) != 0)
            return -1;
        if (len > OI_MAX_ID_BYTES)
            return bad(c, "Unable to parse 'sequence_id': %zu bytes; at most %d are accepted", len, OI_MAX_ID_BYTES);
        oi_buf_unref(req->aux); /* a repeated key: the last one counts */
        if ((req->aux = oi_buf_new(len + 1)) == NULL)
            return out_of_memory(c);
        len = escaped ? oi__json_unescape(req->aux->data, raw, len) : (memcpy(req->aux->data, raw, len), len);
        req->aux->data[len] = '\0';
        req->aux->len = len + 1;
        req->seq.id_str = req->aux->data;
        req->seq.id_str_len = len;
        return 0;
    }
    if (oi__json_is_number_start(ch)) {
        num_t num;
        if (scan_number(c, &num) != 0)
            return -1;
        if (num.is_int && !num.overflow && (!num.neg || num.mant == 0)) {
            req->seq.id = num.mant;
            return 0;
        }
    } else if (oi__json_skip_value(c) != 0) {
        return -1;
    }
    /* Triton reads it as an unsigned integer, then as a string, and reports the second. */
    return bad(c, "Unable to parse 'sequence_id': attempt to access JSON non-string as string");
}

/* Reads a "parameters" object into *span and the `n_want` parameters of `want`; *shm (when
 * not NULL) is set when the object names a "shared_memory_region", whose value the server
 * checks later; `req` (when not NULL) gets the sequence parameters. */
static int parse_params(cursor_t *c, const char *group, uint32_t index, oi_slice_t *span, param_t *want, size_t n_want,
                        uint8_t *shm, oi_request_t *req)
{
    char path[64];
    short_str_t key;
    uint32_t n = 0;
    int r;
    if (oi__json_peek(c) != '{')
        return bad(c, "%s: expected an object, got %s", where(path, group, index, "parameters"),
                   value_kind(c));
    char *start = c->p;
    if (oi__json_enter(c, '{') != 0)
        return -1;
    while ((r = oi__json_next_member(c, &n, &key)) == 1) {
        if (shm != NULL && oi__json_str_is(&key, "shared_memory_region"))
            *shm = 1;
        param_t *p = NULL;
        for (size_t i = 0; i < n_want && p == NULL; i++)
            if (oi__json_str_is(&key, want[i].key))
                p = &want[i];
        if (req != NULL && key.n >= 7 && memcmp(key.s, "triton_", 7) == 0) /* as http_server.cc */
            return bad(c, "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
                          "specified.");
        if (req != NULL && p == NULL &&
            (oi__json_str_is(&key, "sequence_id") || oi__json_str_is(&key, "sequence_start") || oi__json_str_is(&key, "sequence_end")))
            r = read_seq_param(c, req, &key);
        else
            r = p != NULL ? read_param(c, group, index, p) : oi__json_skip_value(c);
        if (r != 0)
            return -1;
    }
    if (r != 0)
        return -1;
    span->ptr = start;
    span->len = (size_t)(c->p - start);
    return 0;
}

/* Reads a tensor name in place; a name is a C string, so it may not hold U+0000. */
static int parse_name(cursor_t *c, const char **out, const char *group, uint32_t index)
{
    char path[64];
    char *s;
    size_t n;
    if (oi__json_peek(c) != '"')
        return bad(c, "%s: expected a string, got %s", where(path, group, index, "name"),
                   value_kind(c));
    if (read_string_in_place(c, &s, &n) != 0)
        return -1;
    if (n > OI_MAX_NAME_BYTES) /* names go back in error messages */
        return bad(c, "%s: %zu bytes; at most %d are accepted", where(path, group, index, "name"), n,
                   OI_MAX_NAME_BYTES);
    if (memchr(s, '\0', n) != NULL)
        return bad(c, "%s: expected a name without \\u0000", where(path, group, index, "name"));
    *out = s;
    return 0;
}

/* One input object being decoded. */
typedef struct input_s {
    oi_tensor_t *t;
    const char *group;   /* "inputs" (or "outputs" in a response), for messages */
    const char *kind;    /* "input" or "output" */
    uint32_t index;      /* position in the group, for messages */
    int has_shape;
    int has_data;
    char *deferred;      /* "data" that came before "shape" or "datatype" */
    uint32_t deferred_depth;
    int64_t binary_size; /* parameters.binary_data_size, or -1 */
} input_t;

/* Names an input in messages: by name once known, else by position. */
static const char *input_label(const input_t *in, char buf[160])
{
    if (in->t->name != NULL)
        snprintf(buf, 160, "%s '%.128s'", in->kind, in->t->name);
    else
        snprintf(buf, 160, "%s[%" PRIu32 "]", in->group, in->index);
    return buf;
}

static int parse_shape(cursor_t *c, input_t *in)
{
    oi_tensor_t *t = in->t;
    char got[48];
    uint32_t n = 0;
    int r;
    if (oi__json_peek(c) != '[') {
        snprintf(got, sizeof(got), "%s", value_kind(c));
        goto wrong;
    }
    if (oi__json_enter(c, '[') != 0)
        return -1;
    while ((r = oi__json_next_element(c, &n)) == 1) {
        if (n > OI_MAX_DIMS)
            return bad(c, "%s[%" PRIu32 "].shape: expected at most %d dimensions, got more", in->group,
                       in->index, OI_MAX_DIMS);
        r = oi__json_read_count(c, &t->shape[n - 1], got);
        if (r == 1)
            goto wrong;
        if (r != 0)
            return -1;
    }
    if (r != 0)
        return -1;
    t->ndim = (int)n;
    in->has_shape = 1;
    return 0;
wrong:
    if (got[0] == '-' || got[0] == '.' || (got[0] >= '0' && got[0] <= '9' && strpbrk(got, ".eE") != NULL)) {
        /* tritonserver reads a dimension as an unsigned integer and answers a negative or
         * fractional one with its JSON library's error, a 500 (its qa/L0_http asserts both). */
        if (c->err == NULL)
            c->err = oi_status_new(OI_INTERNAL, "Unable to parse 'shape': attempt to access JSON "
                                                "non-unsigned-integer as unsigned-integer");
        return -1;
    }
    return bad(c, "%s[%" PRIu32 "].shape: expected an array of non-negative integers, got %s", in->group,
               in->index, got);
}

static int parse_datatype(cursor_t *c, input_t *in)
{
    short_str_t k;
    if (oi__json_peek(c) != '"')
        return bad(c, "%s[%" PRIu32 "].datatype: expected a string, got %s", in->group, in->index,
                   value_kind(c));
    if (read_short(c, &k) != 0)
        return -1;
    in->t->dtype = oi_dtype_from_name(k.s, k.n);
    if (in->t->dtype != OI_TYPE_INVALID)
        return 0;
    char names[160] = "";
    for (int t = 1; t < OI_TYPE_COUNT; t++) {
        size_t len = strlen(names);
        snprintf(names + len, sizeof(names) - len, "%s%s", t > 1 ? ", " : "",
                 oi_dtype_name((oi_dtype_t)t));
    }
    return bad(c, "%s[%" PRIu32 "].datatype: expected one of %s, got \"%.*s\"", in->group, in->index,
               names, (int)(k.n < 64 ? k.n : 64), k.s);
}

/* Where the elements of "data" go as they are converted. */
typedef struct sink_s {
    oi_dtype_t dtype;
    size_t esize;
    int64_t want;    /* elements the shape holds */
    int64_t got;     /* elements read so far; those past `want` are checked but not kept */
    char *fixed;     /* fixed-size types: want * esize bytes */
    oi_sbuf_t bytes; /* BYTES: length-prefixed elements */
} sink_t;

static int element_error(cursor_t *c, const input_t *in, int64_t i, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Reports a bad element as "input 'X': element 3: <what>". */
static int element_error(cursor_t *c, const input_t *in, int64_t i, const char *fmt, ...)
{
    char label[160], what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return bad(c, "%s: element %" PRId64 ": %s", input_label(in, label), i, what);
}

static int wrong_kind(cursor_t *c, const input_t *in, int64_t i, const char *expected)
{
    return element_error(c, in, i, "expected %s for %s, got %s", expected,
                         oi_dtype_name(in->t->dtype), value_kind(c));
}

static int store_integer(cursor_t *c, const input_t *in, int64_t i, const num_t *num, char *dst)
{
    oi_dtype_t t = in->t->dtype;
    int shown = (int)(num->len < 40 ? num->len : 40);
    if (!num->is_int || num->special)
        return element_error(c, in, i, "expected an integer for %s, got %.*s", oi_dtype_name(t),
                             shown, num->text);
    unsigned bits = (unsigned)oi_dtype_size(t) * 8;
    uint64_t all = bits == 64 ? UINT64_MAX : (UINT64_C(1) << bits) - 1;
    uint64_t pos_max = is_signed_int(t) ? all >> 1 : all;
    uint64_t neg_max = is_signed_int(t) ? (all >> 1) + 1 : 0;
    if (num->overflow || num->mant > (num->neg ? neg_max : pos_max))
        return element_error(c, in, i, "%.*s is out of range for %s", shown, num->text,
                             oi_dtype_name(t));
    put_le(dst, num->neg ? 0 - num->mant : num->mant, bits / 8);
    return 0;
}

static int store_float(cursor_t *c, const input_t *in, int64_t i, num_t *num, char *dst)
{
    oi_dtype_t t = in->t->dtype;
    uint64_t bits = num_to_bits(num, t);
    put_le(dst, bits, oi_dtype_size(t));
    if (!num->special && is_inf_bits(bits, t))
        return element_error(c, in, i, "%.*s is out of range for %s",
                             (int)(num->len < 40 ? num->len : 40), num->text, oi_dtype_name(t));
    return 0;
}

static int read_number_element(cursor_t *c, const input_t *in, sink_t *s, int64_t i)
{
    num_t num;
    if (!oi__json_is_number_start(oi__json_peek(c)))
        return wrong_kind(c, in, i, "a number");
    if (scan_number(c, &num) != 0)
        return -1;
    if (i >= s->want)
        return 0;
    char *dst = s->fixed + (size_t)i * s->esize;
    if (is_integer(s->dtype))
        return store_integer(c, in, i, &num, dst);
    return store_float(c, in, i, &num, dst);
}

static int read_bool_element(cursor_t *c, const input_t *in, sink_t *s, int64_t i)
{
    int ch = oi__json_peek(c);
    if (ch != 't' && ch != 'f')
        return wrong_kind(c, in, i, "true or false");
    if (literal(c, ch == 't' ? "true" : "false") != 0)
        return -1;
    if (i < s->want)
        s->fixed[i] = ch == 't';
    return 0;
}

/* A BYTES element is unescaped straight into the tensor buffer behind its length. */
static int read_bytes_element(cursor_t *c, const input_t *in, sink_t *s, int64_t i)
{
    char *raw;
    size_t len;
    int escaped;
    if (oi__json_peek(c) != '"')
        return wrong_kind(c, in, i, "a string");
    if (oi__json_scan_string(c, &raw, &len, &escaped) != 0)
        return -1;
    if (i >= s->want)
        return 0;
    if (len > UINT32_MAX)
        return element_error(c, in, i, "a BYTES element may hold at most 4 GiB");
    if (oi_sbuf_reserve(&s->bytes, 4 + len) != 0)
        return out_of_memory(c);
    char *w = s->bytes.data + s->bytes.len;
    size_t n = len;
    if (escaped)
        n = oi__json_unescape(w + 4, raw, len);
    else
        memcpy(w + 4, raw, len);
    put_le(w, n, 4);
    s->bytes.len += 4 + n;
    return 0;
}

static int read_element(cursor_t *c, const input_t *in, sink_t *s)
{
    int ch = oi__json_peek(c);
    int64_t i = s->got++;
    if (ch != '"' && ch != '{' && ch != 't' && ch != 'f' && ch != 'n' && !oi__json_is_number_start(ch))
        return syntax(c, "a value");
    switch (s->dtype) {
    case OI_TYPE_BOOL:
        return read_bool_element(c, in, s, i);
    case OI_TYPE_BYTES:
        return read_bytes_element(c, in, s, i);
    default:
        return read_number_element(c, in, s, i);
    }
}

/* Refuses nested "data" whose arrays do not follow the shape. */
static int ragged(cursor_t *c, const input_t *in, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int ragged(cursor_t *c, const input_t *in, const char *fmt, ...)
{
    char label[160], shape[24 * OI_MAX_DIMS], what[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    return bad(c, "%s: nested data does not match shape %s: %s (give the elements flat, or nested as the shape is)",
               input_label(in, label), oi_shape_format(in->t->shape, in->t->ndim, shape, sizeof(shape)), what);
}

/* Reads the elements of "data" in row-major order: a bare scalar, one flat array, or arrays
 * nested exactly as the shape is (each array at depth k has shape[k-1] items; values only at
 * depth ndim). Ragged nesting is refused rather than flattened, since it means the client's
 * idea of the shape differs from the one it sent. A counter of open arrays replaces recursion;
 * nesting is bounded by the shape, so items[] cannot overflow. */
static int read_elements(cursor_t *c, const input_t *in, sink_t *s)
{
    const oi_tensor_t *t = in->t;
    enum { UNDECIDED, FLAT, NESTED } form = UNDECIDED;
    int64_t items[OI_MAX_DIMS + 2]; /* items so far in the array open at each depth */
    uint32_t open = 0;
    for (;;) {
        if (oi__json_peek(c) == '[') {
            if (open > 0) {
                if (form == FLAT)
                    return ragged(c, in, "an array at depth %u among values", open + 1);
                if ((int)open >= t->ndim)
                    return ragged(c, in, "an array at depth %u, deeper than the shape", open + 1);
                form = NESTED;
                items[open]++;
            }
            if (oi__json_enter(c, '[') != 0)
                return -1;
            items[++open] = 0;
            if (oi__json_peek(c) != ']')
                continue; /* an element, or a nested array, follows */
        } else {
            if (open > 0) {
                if (form == UNDECIDED)
                    form = FLAT; /* open is 1: a nested form would have opened a second array */
                else if (form == NESTED && (int)open != t->ndim)
                    return ragged(c, in, "a value at depth %u, expected arrays down to depth %d", open, t->ndim);
                items[open]++;
            }
            if (read_element(c, in, s) != 0)
                return -1;
        }
        /* After an element or an empty array: close arrays up to the next ','. */
        for (;;) {
            if (open == 0)
                return 0;
            int ch = oi__json_peek(c);
            if (ch == ',') {
                c->p++;
                break;
            }
            if (ch != ']')
                return syntax(c, "',' or ']'");
            if (form == NESTED && items[open] != t->shape[open - 1])
                return ragged(c, in, "an array at depth %u has %" PRId64 " elements, expected %" PRId64, open,
                              items[open], t->shape[open - 1]);
            c->p++;
            c->depth--;
            open--;
        }
    }
}

static int parse_data(decoder_t *d, input_t *in)
{
    cursor_t *c = &d->c;
    oi_tensor_t *t = in->t;
    char label[160], shape[24 * OI_MAX_DIMS];
    int64_t count;
    size_t json_len = (size_t)(c->end - c->base);
    if (oi_shape_elements(t->shape, t->ndim, &count) != 0) {
        oi_status_t *st = oi_shape_refusal(t->shape, t->ndim, t->dtype, in->kind, t->name, OI_WORDS_HTTP);
        if (st == NULL)
            return bad(c, "%s: shape %s has too many elements", input_label(in, label),
                       oi_shape_format(t->shape, t->ndim, shape, sizeof(shape)));
        if (c->err == NULL)
            c->err = st;
        else
            oi_status_free(st);
        return -1;
    }
    /* Every element takes at least one byte of JSON, so a larger count cannot match: reject
     * it before allocating anything for it. */
    if ((uint64_t)count > json_len)
        return bad(c, "%s: shape %s has %" PRId64 " elements but the request body has only %zu bytes",
                   input_label(in, label), oi_shape_format(t->shape, t->ndim, shape, sizeof(shape)),
                   count, json_len);
    sink_t s = {.dtype = t->dtype, .esize = oi_dtype_size(t->dtype), .want = count};
    if (t->dtype != OI_TYPE_BYTES) {
        oi_buf_t *b = oi_buf_new((size_t)count * s.esize);
        if (b == NULL)
            return out_of_memory(c);
        b->len = b->cap;
        t->owner = b;
        t->data = s.fixed = b->data;
        t->byte_size = b->len;
    } else if (oi_sbuf_reserve(&s.bytes, 4 * (size_t)(count < 256 ? count : 256) + 1) != 0) {
        /* BYTES grow as they come (element sizes are unknown); reserving at least one byte
         * gives even an empty tensor a buffer. */
        return out_of_memory(c);
    }
    int r = read_elements(c, in, &s);
    if (r == 0 && s.got != count)
        r = bad(c, "%s: expected %" PRId64 " elements for shape %s, got %" PRId64,
                input_label(in, label), count,
                oi_shape_format(t->shape, t->ndim, shape, sizeof(shape)), s.got);
    if (r == 0 && t->dtype == OI_TYPE_BYTES) {
        oi_buf_t *b = oi_sbuf_detach(&s.bytes);
        if (b == NULL)
            r = out_of_memory(c);
        else {
            t->owner = b;
            t->data = b->data;
            t->byte_size = b->len;
        }
    }
    oi_sbuf_free(&s.bytes);
    return r;
}

/* Points a binary input at the next binary_data_size bytes after the JSON. */
static int take_binary(decoder_t *d, input_t *in)
{
    cursor_t *c = &d->c;
    oi_tensor_t *t = in->t;
    char label[160];
    size_t json_len = (size_t)(c->end - c->base);
    size_t left = d->body->len - json_len - d->bin_used;
    if ((uint64_t)in->binary_size > left)
        return bad(c, "%s: binary_data_size is %" PRId64 " but only %zu bytes of binary data remain after the JSON",
                   input_label(in, label), in->binary_size, left);
    t->data = d->body->data + json_len + d->bin_used;
    t->byte_size = (size_t)in->binary_size;
    t->owner = oi_buf_ref(d->body);
    d->bin_used += t->byte_size;
    oi_status_t *st = strcmp(in->kind, "input") == 0 ? oi_tensor_check_input(t, in->kind, in->t->name)
                                                      : oi_tensor_check_size(t, in->kind, in->t->name);
    if (st != NULL && c->err == NULL)
        c->err = st;
    else
        oi_status_free(st);
    return st != NULL ? -1 : 0;
}

static int finish_input(decoder_t *d, input_t *in)
{
    cursor_t *c = &d->c;
    char label[160];
    if (in->t->name == NULL)
        return bad(c, "%s[%" PRIu32 "]: field 'name' is required", in->group, in->index);
    if (!in->has_shape)
        return bad(c, "%s: field 'shape' is required", input_label(in, label));
    if (in->t->dtype == OI_TYPE_INVALID)
        return bad(c, "%s: field 'datatype' is required", input_label(in, label));
    if (in->has_data && in->binary_size >= 0)
        return bad(c, "%s: expected either \"data\" or parameters.binary_data_size, got both",
                   input_label(in, label));
    if (in->t->shm && (in->has_data || in->binary_size >= 0))
        return bad(c, "%s: expected one of \"data\", parameters.binary_data_size or "
                      "parameters.shared_memory_region, got %s and shared_memory_region",
                   input_label(in, label), in->has_data ? "\"data\"" : "binary_data_size");
    if (in->t->shm)
        return 0; /* the server points it into the region */
    if (in->binary_size >= 0)
        return take_binary(d, in);
    if (!in->has_data)
        return bad(c, "%s: field 'data' is required (or parameters.binary_data_size or "
                      "parameters.shared_memory_region)",
                   input_label(in, label));
    if (in->deferred == NULL)
        return 0;
    char *resume = c->p;
    uint32_t depth = c->depth;
    c->p = in->deferred;
    c->depth = in->deferred_depth;
    int r = parse_data(d, in);
    c->p = resume;
    c->depth = depth;
    return r;
}

enum { IN_NAME, IN_SHAPE, IN_DATATYPE, IN_PARAMETERS, IN_DATA };
static const char *const input_keys[] = {"name", "shape", "datatype", "parameters", "data", NULL};

static int parse_input(decoder_t *d, input_t *in)
{
    cursor_t *c = &d->c;
    short_str_t key;
    uint32_t n = 0, seen = 0;
    int r;
    if (oi__json_peek(c) != '{')
        return bad(c, "%s[%" PRIu32 "]: expected an object, got %s", in->group, in->index, value_kind(c));
    if (oi__json_enter(c, '{') != 0)
        return -1;
    while ((r = oi__json_next_member(c, &n, &key)) == 1) {
        int k = key_index(&key, input_keys);
        if (claim_key(c, &seen, k, input_keys, in->group, in->index) != 0)
            return -1;
        switch (k) {
        case IN_NAME:
            r = parse_name(c, &in->t->name, in->group, in->index);
            break;
        case IN_SHAPE:
            r = parse_shape(c, in);
            break;
        case IN_DATATYPE:
            r = parse_datatype(c, in);
            break;
        case IN_PARAMETERS: {
            param_t want = {"binary_data_size", 0, -1};
            r = parse_params(c, in->group, in->index, &in->t->parameters, &want, 1, &in->t->shm, NULL);
            in->binary_size = want.value;
            break;
        }
        case IN_DATA:
            in->has_data = 1;
            if (in->has_shape && in->t->dtype != OI_TYPE_INVALID && in->binary_size < 0) {
                r = parse_data(d, in);
            } else {
                in->deferred = c->p;
                in->deferred_depth = c->depth;
                r = oi__json_skip_value(c);
            }
            break;
        default:
            r = oi__json_skip_value(c);
        }
        if (r != 0)
            return -1;
    }
    return r != 0 ? -1 : finish_input(d, in);
}

static int parse_inputs(decoder_t *d)
{
    cursor_t *c = &d->c;
    oi_request_t *req = d->req;
    uint32_t n = 0;
    int r;
    if (oi__json_peek(c) != '[')
        return bad(c, "%s: expected an array of %s objects, got %s", d->group, d->kind, value_kind(c));
    if (oi__json_enter(c, '[') != 0)
        return -1;
    while ((r = oi__json_next_element(c, &n)) == 1) {
        oi_tensor_t *t = oi_tensor_push(&req->inputs, &req->n_inputs);
        if (t == NULL)
            return out_of_memory(c);
        input_t in = {.t = t, .group = d->group, .kind = d->kind, .index = n - 1, .binary_size = -1};
        if (parse_input(d, &in) != 0)
            return -1;
    }
    if (r != 0)
        return -1;
    if (n == 0 && d->resp == NULL)
        return bad(c, "inputs: expected at least one input, got an empty array");
    return 0;
}

/* Appends a zeroed requested output; the capacity follows the count as in oi_tensor_push. */
static oi_output_request_t *push_output(oi_request_t *req)
{
    uint32_t n = req->n_outputs;
    if (n == 0 || (n >= 4 && (n & (n - 1)) == 0)) {
        oi_output_request_t *p = realloc(req->outputs, (n ? (size_t)n * 2 : 4) * sizeof(*p));
        if (p == NULL)
            return NULL;
        req->outputs = p;
    }
    oi_output_request_t *o = &req->outputs[n];
    memset(o, 0, sizeof(*o));
    o->binary_data = -1;
    req->n_outputs = n + 1;
    return o;
}

enum { OUT_NAME, OUT_PARAMETERS };
static const char *const output_keys[] = {"name", "parameters", NULL};

static int parse_output(decoder_t *d, uint32_t index)
{
    cursor_t *c = &d->c;
    short_str_t key;
    uint32_t n = 0, seen = 0;
    int r;
    oi_output_request_t *o = push_output(d->req);
    if (o == NULL)
        return out_of_memory(c);
    if (oi__json_peek(c) != '{')
        return bad(c, "outputs[%" PRIu32 "]: expected an object, got %s", index, value_kind(c));
    if (oi__json_enter(c, '{') != 0)
        return -1;
    while ((r = oi__json_next_member(c, &n, &key)) == 1) {
        int k = key_index(&key, output_keys);
        if (claim_key(c, &seen, k, output_keys, "outputs", index) != 0)
            return -1;
        if (k == OUT_NAME) {
            r = parse_name(c, &o->name, "outputs", index);
        } else if (k == OUT_PARAMETERS) {
            param_t want = {"binary_data", 1, -1};
            r = parse_params(c, "outputs", index, &o->parameters, &want, 1, NULL, NULL);
            o->binary_data = (int)want.value;
        } else {
            r = oi__json_skip_value(c);
        }
        if (r != 0)
            return -1;
    }
    if (r != 0)
        return -1;
    if (o->name == NULL)
        return bad(c, "outputs[%" PRIu32 "]: field 'name' is required", index);
    return 0;
}

static int parse_outputs(decoder_t *d)
{
    cursor_t *c = &d->c;
    uint32_t n = 0;
    int r;
    if (oi__json_peek(c) != '[')
        return bad(c, "outputs: expected an array of output objects, got %s", value_kind(c));
    if (oi__json_enter(c, '[') != 0)
        return -1;
    while ((r = oi__json_next_element(c, &n)) == 1)
        if (parse_output(d, n - 1) != 0)
            return -1;
    return r;
}

enum { REQ_ID, REQ_PARAMETERS, REQ_INPUTS, REQ_OUTPUTS, REQ_MODEL_NAME, REQ_MODEL_VERSION };
static const char *const request_keys[] = {"id", "parameters", "inputs", "outputs", NULL};
/* A response: its "outputs" are tensors like a request's inputs. */
static const char *const response_keys[] = {"id", "parameters", "\x01", "outputs", "model_name", "model_version",
                                            NULL}; /* "\x01" holds REQ_INPUTS' place: no JSON key */

static int parse_top_string(cursor_t *c, const char *field, const char **out, size_t *len)
{
    char *s = NULL;
    size_t n;
    if (oi__json_peek(c) == 'n' && at_literal(c, "null")) /* some servers (KServe) send "model_version": null */
        return literal(c, "null");
    if (oi__json_peek(c) != '"')
        return bad(c, "%s: expected a string, got %s", field, value_kind(c));
    int r = read_string_in_place(c, &s, &n);
    if (r == 0 && n > OI_MAX_ID_BYTES) /* the id goes back with the answer: keep it small */
        return bad(c, "%s: %zu bytes; at most %d are accepted", field, n, OI_MAX_ID_BYTES);
    *out = s;
    if (len != NULL)
        *len = n;
    return r;
}

static int parse_request(decoder_t *d)
{
    cursor_t *c = &d->c;
    oi_request_t *req = d->req;
    short_str_t key;
    uint32_t n = 0, seen = 0;
    int r;
    const char *const *keys = d->resp ? response_keys : request_keys;
    if (oi__json_peek(c) != '{')
        return bad(c, "%s body: expected a JSON object, got %s", d->resp ? "response" : "request",
                   value_kind(c));
    if (oi__json_enter(c, '{') != 0)
        return -1;
    while ((r = oi__json_next_member(c, &n, &key)) == 1) {
        int k = key_index(&key, keys);
        if (claim_key(c, &seen, k, keys, NULL, 0) != 0)
            return -1;
        if (d->resp && k == REQ_OUTPUTS)
            k = REQ_INPUTS; /* a response's outputs are decoded as tensors */
        switch (k) {
        case REQ_ID:
            r = parse_top_string(c, "id", &req->id, &req->id_len);
            break;
        case REQ_MODEL_NAME:
            r = parse_top_string(c, "model_name", &d->resp->model_name, NULL);
            break;
        case REQ_MODEL_VERSION:
            r = parse_top_string(c, "model_version", &d->resp->model_version, NULL);
            break;
        case REQ_PARAMETERS: {
            /* Triton's per-request queue timeout, in microseconds (0: none), and priority
             * level (0: the model's default). */
            param_t want[3] = {{"binary_data_output", 1, -1}, {"timeout", 0, -1}, {"priority", 0, -1}};
            r = parse_params(c, NULL, 0, &req->parameters, want, 3, NULL, d->resp ? NULL : req);
            req->binary_data_output = (int)want[0].value;
            req->timeout_us = want[1].value > 0 ? (uint64_t)want[1].value : 0;
            req->priority = want[2].value > 0 ? (uint64_t)want[2].value : 0;
            break;
        }
        case REQ_INPUTS:
            r = parse_inputs(d);
            break;
        case REQ_OUTPUTS:
            r = parse_outputs(d);
            break;
        default:
            r = oi__json_skip_value(c);
        }
        if (r != 0)
            return -1;
    }
    if (r != 0)
        return -1;
    if (oi__json_peek(c) != -1)
        return bad(c, "malformed JSON at byte %zu: unexpected data after the top-level object",
                   offset(c));
    if (!d->resp && !(seen & (1u << REQ_INPUTS)))
        return bad(c, "field 'inputs' is required");
    return 0;
}

static int finish_request(decoder_t *d)
{
    cursor_t *c = &d->c;
    oi_request_t *req = d->req;
    size_t bin_len = d->body->len - (size_t)(c->end - c->base);
    if (d->bin_used != bin_len)
        return bad(c, "binary data: %zu bytes follow the JSON but the %s' binary_data_size add up to %zu",
                   bin_len, d->group, d->bin_used);
    oi_status_t *st = oi_request_check_unique(req, d->kind); /* the check gRPC makes too */
    if (st == NULL)
        return 0;
    if (c->err == NULL)
        c->err = st;
    else
        oi_status_free(st);
    return -1;
}

static oi_status_t *decode(oi_buf_t *body, size_t json_len, oi_request_t *req, oi_json_response_t *resp,
                           const oi_json_limits_t *limits)
{
    const char *what = resp ? "response" : "request";
    if (json_len > body->len)
        return oi_status_new(OI_BAD_REQUEST, "the JSON header length %zu exceeds the %s body (%zu bytes)",
                             json_len, what, body->len);
    if (json_len == 0)
        return oi_status_new(OI_BAD_REQUEST, "%s body: expected a JSON object, got nothing", what);
    uint32_t max_depth = limits != NULL && limits->max_depth ? limits->max_depth : OI_JSON_DEFAULT_DEPTH;
    decoder_t d = {
        .c = {body->data, body->data, body->data + json_len, 0,
              max_depth < OI_JSON_MAX_DEPTH ? max_depth : OI_JSON_MAX_DEPTH, NULL},
        .body = body,
        .req = req,
        .resp = resp,
        .group = resp ? "outputs" : "inputs",
        .kind = resp ? "output" : "input",
    };
    int r = parse_request(&d);
    if (r == 0)
        r = finish_request(&d);
    if (r != 0) {
        oi_request_clear(req);
        return d.c.err != NULL ? d.c.err : oi_status_new(OI_INTERNAL, "%s decoding failed", what);
    }
    req->body = oi_buf_ref(body);
    return NULL;
}

oi_status_t *oi_json_decode_infer_request(oi_buf_t *body, size_t json_len, oi_request_t *req,
                                          const oi_json_limits_t *limits)
{
    return decode(body, json_len, req, NULL, limits);
}

oi_status_t *oi_json_decode_infer_response(oi_buf_t *body, size_t json_len, oi_json_response_t *resp,
                                           const oi_json_limits_t *limits)
{
    memset(resp, 0, sizeof(*resp));
    resp->result.binary_data_output = -1;
    oi_status_t *st = decode(body, json_len, &resp->result, resp, limits);
    if (st != NULL)
        memset(resp, 0, sizeof(*resp));
    return st;
}
