#include "codec/compress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* zlib's windowBits: 15 for the zlib format, +16 for gzip, +32 to detect either; -15 raw. */
#define ZLIB_WINDOW 15

oi_encoding_t oi_content_encoding(const char *v)
{
    if (*v == '\0' || strcmp(v, "identity") == 0)
        return OI_ENCODING_IDENTITY;
    if (strcmp(v, "gzip") == 0 || strcmp(v, "x-gzip") == 0)
        return OI_ENCODING_GZIP;
    if (strcmp(v, "deflate") == 0)
        return OI_ENCODING_DEFLATE;
    return OI_ENCODING_UNKNOWN;
}

/* The q value of one Accept-Encoding entry ("gzip;q=0.5" -> 0.5); 1 when absent. */
static double entry_q(const char *params, const char *end)
{
    const char *q = params;
    while (q < end && (q = memchr(q, 'q', (size_t)(end - q))) != NULL) {
        const char *p = q + 1;
        while (p < end && *p == ' ')
            p++;
        if (p < end && *p == '=')
            return strtod(p + 1, NULL);
        q++;
    }
    return 1.0;
}

oi_encoding_t oi_accept_encoding(const char *v)
{
    double gzip = 0, deflate = 0;
    while (*v) {
        while (*v == ' ' || *v == ',')
            v++;
        const char *end = strchr(v, ',');
        if (end == NULL)
            end = v + strlen(v);
        const char *semi = memchr(v, ';', (size_t)(end - v));
        const char *name_end = semi ? semi : end;
        while (name_end > v && name_end[-1] == ' ')
            name_end--;
        size_t n = (size_t)(name_end - v);
        double q = semi ? entry_q(semi, end) : 1.0;
        if ((n == 4 && memcmp(v, "gzip", 4) == 0) || (n == 6 && memcmp(v, "x-gzip", 6) == 0))
            gzip = q;
        else if (n == 7 && memcmp(v, "deflate", 7) == 0)
            deflate = q;
        v = end;
    }
    if (gzip > 0 && gzip >= deflate)
        return OI_ENCODING_GZIP;
    return deflate > 0 ? OI_ENCODING_DEFLATE : OI_ENCODING_IDENTITY;
}

/* Bytes of scratch output for the measuring pass: the first of them are the prefix checked. */
#define MEASURE_CHUNK OI_INFLATE_PREFIX_BYTES

/* How an error shows the byte `ch`: 'x' when printable, else its hex value. */
static void describe_byte(char *out, size_t cap, unsigned char ch)
{
    if (ch >= 0x20 && ch < 0x7f && ch != '\'' && ch != '"' && ch != '\\')
        snprintf(out, cap, "'%c'", ch);
    else
        snprintf(out, cap, "byte 0x%02x", ch);
}

/* Whether the first n inflated bytes (all of them when `ended`) can begin a JSON object of
 * json_len bytes: NULL, or a 400. */
static oi_status_t *check_json(const oi_inflate_limit_t *lim, const unsigned char *p, size_t n, int ended)
{
    size_t m = n < lim->json_len ? n : lim->json_len, i = 0;
    while (i < m && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n'))
        i++;
    if (i < m && p[i] == '{')
        return NULL;
    if (i < m) {
        char got[16];
        describe_byte(got, sizeof(got), p[i]);
        return oi_status_new(OI_BAD_REQUEST,
                             "the decompressed %s is not a JSON object: it starts with %s, expected '{'", lim->what,
                             got);
    }
    if (m == lim->json_len && m > 0)
        return oi_status_new(OI_BAD_REQUEST,
                             "the decompressed %s holds no JSON object: its %zu JSON bytes are whitespace", lim->what,
                             m);
    if (!ended && n >= MEASURE_CHUNK)
        return oi_status_new(OI_BAD_REQUEST,
                             "the decompressed %s starts with %zu bytes of whitespace, where a JSON object was "
                             "expected",
                             lim->what, n);
    return NULL; /* short and blank: the JSON parser says what is wrong */
}

/* Whether the first n inflated bytes can begin a protobuf message: empty, or a first tag of a
 * field number from 1 and a wire type up to 5. NULL, or a 400. */
static oi_status_t *check_protobuf(const oi_inflate_limit_t *lim, const unsigned char *p, size_t n)
{
    if (n == 0)
        return NULL;
    uint64_t tag = 0;
    size_t i = 0;
    for (; i < n && i < 5; i++) {
        tag |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80))
            break;
    }
    if (i < n && i < 5 && (tag >> 3) >= 1 && (tag >> 3) <= 0x1fffffff && (tag & 7) <= 5)
        return NULL;
    if (i == n) /* the whole message is a cut-off varint */
        return oi_status_new(OI_BAD_REQUEST,
                             "the decompressed %s is not a protobuf message: it ends inside its first tag", lim->what);
    return oi_status_new(OI_BAD_REQUEST,
                         "the decompressed %s is not a protobuf message: its first tag names field %llu with wire "
                         "type %u (expected a field from 1 and a wire type up to 5)",
                         lim->what, (unsigned long long)(tag >> 3), (unsigned)(tag & 7));
}

static oi_status_t *check_prefix(const oi_inflate_limit_t *lim, const char *p, size_t n, int ended)
{
    switch (lim->expect) {
    case OI_INFLATE_JSON: return check_json(lim, (const unsigned char *)p, n, ended);
    case OI_INFLATE_PROTOBUF: return check_protobuf(lim, (const unsigned char *)p, n);
    default: return NULL;
    }
}

/* The most the body may inflate to, and the setting that says so (for the 413). */
static size_t inflate_cap(const oi_inflate_limit_t *lim, size_t len, int *by_ratio)
{
    size_t cap = lim->max_out ? lim->max_out : SIZE_MAX;
    *by_ratio = 0;
    if (lim->max_ratio > 0 && len <= (SIZE_MAX - OI_INFLATE_RATIO_FLOOR) / lim->max_ratio) {
        size_t r = len * lim->max_ratio;
        if (r < OI_INFLATE_RATIO_FLOOR)
            r = OI_INFLATE_RATIO_FLOOR;
        if (r < cap) {
            cap = r;
            *by_ratio = 1;
        }
    }
    return cap;
}

/* One pass of zlib over the body. With dst NULL it only measures: output goes to a scratch
 * buffer and is counted, its first MEASURE_CHUNK bytes are checked against lim->expect, and
 * the pass stops with a 413 as soon as the count passes what the limits allow. With dst it
 * writes exactly `cap` bytes there, the size measured before. Returns NULL with *total set,
 * or a status. */
static oi_status_t *inflate_pass(const char *data, size_t len, int window, const oi_inflate_limit_t *lim, char *dst,
                                 size_t cap, size_t *total)
{
    int by_ratio = 0;
    size_t max_out = dst == NULL ? inflate_cap(lim, len, &by_ratio) : SIZE_MAX;
    z_stream z;
    memset(&z, 0, sizeof(z));
    if (inflateInit2(&z, window) != Z_OK)
        return oi_status_new(OI_INTERNAL, "cannot start decompression");
    char *scratch = dst == NULL ? malloc(MEASURE_CHUNK) : NULL;
    oi_status_t *st =
        dst == NULL && scratch == NULL ? oi_status_new(OI_INTERNAL, "out of memory for decompression") : NULL;
    size_t n = 0;
    int checked = dst != NULL; /* the prefix: scratch fills up from its start until checked */
    z.next_in = (Bytef *)data;
    int rc = Z_OK;
    while (st == NULL && rc != Z_STREAM_END) {
        /* zlib counts in uInt: feed and drain at most 1 GiB a step. */
        size_t in_left = len - (size_t)((const char *)z.next_in - data);
        size_t off = dst ? n : checked ? 0 : n;
        size_t room = dst ? cap - n : MEASURE_CHUNK - off;
        z.avail_in = (uInt)(in_left > (1u << 30) ? (1u << 30) : in_left);
        z.next_out = (Bytef *)(dst ? dst : scratch) + off;
        z.avail_out = (uInt)(room > (1u << 30) ? (1u << 30) : room);
        uInt before = z.avail_out;
        rc = inflate(&z, Z_NO_FLUSH);
        n += before - z.avail_out;
        if (!checked && (n >= MEASURE_CHUNK || rc == Z_STREAM_END)) {
            checked = 1;
            st = check_prefix(lim, scratch, n < MEASURE_CHUNK ? n : MEASURE_CHUNK, rc == Z_STREAM_END);
        }
        if (st != NULL)
            break;
        if (n > max_out && by_ratio)
            st = oi_status_new(OI_TOO_LARGE,
                               "the compressed %s of %zu bytes inflates to more than %zu bytes, past the server's "
                               "max_inflate_ratio of %u (beyond the first %zu bytes)",
                               lim->what, len, max_out, lim->max_ratio, OI_INFLATE_RATIO_FLOOR);
        else if (n > max_out && lim->triton_flag != NULL)
            st = oi_status_new(OI_BAD_REQUEST, "Decompressed data size exceeds the maximum allowed value of %zu bytes. "
                               "Use %s to increase the limit.", max_out, lim->triton_flag);
        else if (n > max_out)
            st = oi_status_new(OI_TOO_LARGE, "the decompressed %s exceeds the server's %s (%zu)", lim->what,
                               lim->limit_name, max_out);
        else if (rc == Z_BUF_ERROR && dst != NULL && n == cap)
            st = oi_status_new(OI_INTERNAL, "the compressed %s inflated differently twice", lim->what);
        else if (rc == Z_BUF_ERROR && z.avail_in == 0 && in_left == 0)
            st = oi_status_new(OI_BAD_REQUEST, "the compressed %s is truncated", lim->what);
        else if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR)
            st = oi_status_new(OI_BAD_REQUEST, "the compressed %s is corrupt: %s", lim->what,
                               z.msg ? z.msg : "bad data");
    }
    inflateEnd(&z);
    free(scratch);
    *total = n;
    return st;
}

/* Inflates in two passes: the first measures the output in a small scratch buffer (a bomb is
 * refused there, having cost nothing past the limit), the second writes it into one buffer of
 * exactly that size, charged to the budget before it is allocated. Twice the CPU of one pass,
 * but no growing buffer whose copies and doublings would reach several times the limit. */
static oi_status_t *inflate_with(const char *data, size_t len, int window, const oi_inflate_limit_t *lim,
                                 oi_buf_t **out)
{
    size_t total, written;
    oi_status_t *st = inflate_pass(data, len, window, lim, NULL, 0, &total);
    if (st != NULL)
        return st;
    int over = 0;
    oi_buf_t *b = oi_buf_new_charged(total, lim->budget, &over);
    if (b == NULL && over) {
        char what[64];
        snprintf(what, sizeof(what), "decompressed %s", lim->what);
        return oi_budget_refusal(lim->budget, what, total);
    }
    if (b == NULL)
        return oi_status_new(OI_INTERNAL, "out of memory for the decompressed %s (%zu bytes)", lim->what, total);
    st = inflate_pass(data, len, window, lim, b->data, total, &written);
    if (st == NULL && written != total)
        st = oi_status_new(OI_INTERNAL, "the compressed %s inflated differently twice", lim->what);
    if (st != NULL) {
        oi_buf_unref(b);
        return st;
    }
    b->len = total;
    *out = b;
    return NULL;
}

oi_status_t *oi_inflate(const char *data, size_t len, oi_encoding_t enc, const oi_inflate_limit_t *lim, oi_buf_t **out)
{
    if (enc == OI_ENCODING_GZIP)
        return inflate_with(data, len, ZLIB_WINDOW + 16, lim, out);
    /* "deflate" means the zlib format (RFC 9110), but some clients send raw deflate. */
    int zlib_header = len >= 2 && (((unsigned char)data[0] << 8) | (unsigned char)data[1]) % 31 == 0 &&
                      (data[0] & 0x0f) == 8;
    return inflate_with(data, len, zlib_header ? ZLIB_WINDOW : -ZLIB_WINDOW, lim, out);
}

/* Runs deflate over `len` bytes with `flush`, growing *b as needed: until the input is taken
 * (Z_NO_FLUSH) or the stream is finished (Z_FINISH). Returns 0 or -1. */
static int deflate_step(z_stream *z, oi_buf_t **b, const char *p, size_t len, int flush)
{
    for (;;) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : len; /* zlib counts in uInt */
        z->next_in = (Bytef *)p;
        z->avail_in = (uInt)chunk;
        int last = chunk == len;
        int mode = last ? flush : Z_NO_FLUSH;
        int zr;
        do {
            if ((*b)->cap - (*b)->len < 4096) {
                oi_buf_t *nb = oi_buf_grow(*b, (*b)->cap * 2 + 65536);
                if (nb == NULL)
                    return -1;
                *b = nb;
            }
            size_t room = (*b)->cap - (*b)->len;
            z->next_out = (Bytef *)(*b)->data + (*b)->len;
            z->avail_out = (uInt)(room > (1u << 30) ? (1u << 30) : room);
            uInt before = z->avail_out;
            zr = deflate(z, mode);
            (*b)->len += before - z->avail_out;
            if (zr == Z_STREAM_ERROR)
                return -1;
        } while (mode == Z_FINISH ? zr != Z_STREAM_END : (z->avail_in > 0 || z->avail_out == 0));
        if (last)
            return 0;
        p += chunk;
        len -= chunk;
    }
}

int oi_deflate(const char *const *parts, const size_t *lens, size_t n, oi_encoding_t enc, oi_buf_t **out)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += lens[i];
    z_stream z;
    memset(&z, 0, sizeof(z));
    if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, enc == OI_ENCODING_GZIP ? ZLIB_WINDOW + 16 : ZLIB_WINDOW,
                     8, Z_DEFAULT_STRATEGY) != Z_OK)
        return -1;
    oi_buf_t *b = oi_buf_new(total / 4 + 4096);
    int rc = b ? 0 : -1;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = deflate_step(&z, &b, parts[i], lens[i], Z_NO_FLUSH);
    if (rc == 0)
        rc = deflate_step(&z, &b, "", 0, Z_FINISH);
    deflateEnd(&z);
    if (rc != 0) {
        oi_buf_unref(b);
        return -1;
    }
    *out = b;
    return 0;
}
